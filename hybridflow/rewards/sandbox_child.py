"""The program a sandboxed child runs first (``python -I -S -c BOOTSTRAP code.py fn_name hook``).

It reads the untrusted code, installs an audit hook (which no Python code can remove), then runs the
code in fresh globals. The hook is the last line of defence where the kernel layers (namespaces, a
dropped uid) are unavailable: Python's docs say audit hooks are not a security boundary, so they
catch honest mistakes and naive escapes, not a determined attacker. The hook and its settings live
only in a closure, with ``gc`` and tracing denied, so user code cannot reach them to change them.
"""

from __future__ import annotations

EXIT_MEMORY = 86  # the code raised MemoryError (RLIMIT_AS reached)
RESULT_MARKER = "\x00hybridflow-result:"  # fn_name mode: the line carrying the JSON return value

BOOTSTRAP = r"""
import builtins, json, os, sys
_code_path, _fn_name, _use_hook = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with open(_code_path, encoding="utf-8") as _f:
    _source = _f.read()
_call_args = json.loads(sys.stdin.read()) if _fn_name else None


def _install_hook(root, pid):
    denied = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "resource.setrlimit", "resource.prlimit", "os.chroot",
    })
    denied_prefixes = ("socket.", "ctypes.")
    denied_imports = frozenset({
        "gc", "ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_testcapi",
        "_testinternalcapi", "_multiprocessing",
    })
    path_events = frozenset({
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
        "os.link", "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree",
        "shutil.move", "shutil.copyfile", "shutil.copytree", "shutil.chown", "os.mkfifo", "os.mknod",
    })
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    realpath, fsdecode, isdir, path_like = os.path.realpath, os.fsdecode, os.path.isdir, os.PathLike
    own_proc = "/proc/%d/" % pid

    def resolve(path):
        return realpath(fsdecode(path))

    def inside(real):
        return real == root or real.startswith(root + "/")

    def deny(what):
        raise PermissionError("sandbox: %s is not allowed" % what)

    def hook(event, args):
        if event in denied or event.startswith(denied_prefixes):
            deny(event)
        if event == "import":
            if str(args[0]).partition(".")[0] in denied_imports:
                deny("import " + str(args[0]))
        elif event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            real = resolve(path)
            if inside(real) or real == "/dev/null":
                return
            if (mode and any(c in mode for c in "wax+")) or (flags or 0) & write_flags:
                deny("writing " + real)
            if real.endswith("/environ") or (real.startswith("/proc/") and not real.startswith(own_proc)):
                deny("reading " + real)
            if isdir(real):  # a directory fd outside cwd could serve as dir_fd for writes
                deny("opening directory " + real)
        elif event in path_events:
            for arg in args:
                if isinstance(arg, (str, bytes, path_like)) and not inside(resolve(arg)):
                    deny("%s on %s" % (event, fsdecode(arg)))

    sys.addaudithook(hook)


if _use_hook:
    _install_hook(os.path.realpath(os.getcwd()), os.getpid())
del _install_hook

sys.argv = ["solution.py"]
_globals = {"__name__": "__main__", "__builtins__": builtins, "__file__": "solution.py"}
try:
    exec(compile(_source, "solution.py", "exec"), _globals)
    if _fn_name:
__CALL_FN__
except MemoryError:
    try:
        sys.stdout.flush()
        sys.stderr.write("MemoryError\n")
        sys.stderr.flush()
    finally:
        os._exit(__EXIT_MEMORY__)
"""


def call_fn_source(marker: str = RESULT_MARKER, indent: str = "") -> str:
    """Python that calls ``_fn_name`` (a function, or a method of a ``Solution`` class, as LeetCode-style data
    has it) from ``_globals`` on ``_call_args`` and prints its JSON return value after ``marker``: the part of
    a call test that the local child and a SandboxFusion run share."""
    lines = (
        "_fn = _globals.get(_fn_name)",
        'if not callable(_fn) and isinstance(_globals.get("Solution"), type):',
        '    _fn = getattr(_globals["Solution"](), _fn_name, None)',
        "if not callable(_fn):",
        '    raise NameError("function %r is not defined" % _fn_name)',
        "_result = _fn(*_call_args)",
        f'sys.stdout.write("\\n" + {marker!r} + json.dumps(_result, default=repr) + "\\n")',
    )
    return "".join(f"{indent}{line}\n" for line in lines)


BOOTSTRAP = BOOTSTRAP.replace("__CALL_FN__", call_fn_source(indent="        ").rstrip("\n")).replace(
    "__EXIT_MEMORY__", str(EXIT_MEMORY)
)
