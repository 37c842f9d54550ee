"""Rules of the library's source, read from the AST (so they hold for code no test runs):

- ``print(`` only in the ``main()`` of a command-line entry point (a module with an
  ``if __name__ == "__main__":`` block) and the few places listed below; the library logs through
  ``logging`` under the ``hybridflow`` logger;
- the library never configures logging itself (no ``basicConfig``; handlers only in
  ``utils/logging_utils.py``, which entry points call);
- the generic helpers that once had copies are defined once.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "hybridflow"

# (module, enclosing function) -> why printing is the product there
PRINT_ALLOWED = {
    ("utils/tracking.py", "_Console.log"): "trainer.logger=console: one line per step on stdout",
    ("config/loader.py", "parse_cli"): "the entry points' shared command line: --help, --cfg job, usage errors",
    ("data/preprocess/local_io.py", "preprocess_main"): "the main() every preprocessing script runs",
}
DEFINED_ONCE = {
    "resolve_dtype": "utils/torch_dtypes.py",
    "strip_wrapper_prefixes": "utils/param_names.py",
    "leaf_items": "utils/nested_dict.py",
}


def _modules():
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        yield path.relative_to(PACKAGE_ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def calls(tree: ast.AST, name: str) -> list[tuple[int, list[str]]]:
    """(line, enclosing class/function names from the outside in) of every call of ``name`` (a bare
    name like ``print`` or an attribute like ``basicConfig``)."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = (
                    func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                )
                if called == name:
                    found.append((child.lineno, scope))
            visit(child, scope)

    visit(tree, [])
    return found


def print_violations(modules) -> list[str]:
    bad = []
    for rel, tree in modules:
        entry_point = any(_is_main_guard(node) for node in tree.body)
        for line, scope in calls(tree, "print"):
            where = ".".join(scope) or "<module>"
            if entry_point and scope and scope[0] == "main":
                continue
            if (rel, where) not in PRINT_ALLOWED:
                bad.append(f"hybridflow/{rel}:{line} print() in {where}")
    return bad


def test_the_checker_finds_prints_outside_entry_point_mains():
    library = ast.parse("def f():\n    print('x')\nclass C:\n    def main(self):\n        print('y')\n")
    entry = ast.parse(
        "def main():\n    print('ok')\n    def inner():\n        print('ok too')\n"
        "def helper():\n    print('no')\nif __name__ == '__main__':\n    main()\n"
    )
    not_entry = ast.parse("def main():\n    print('no guard')\n")
    found = print_violations([("lib.py", library), ("cli.py", entry), ("x.py", not_entry)])
    assert found == [
        "hybridflow/lib.py:2 print() in f",
        "hybridflow/lib.py:5 print() in C.main",
        "hybridflow/cli.py:6 print() in helper",
        "hybridflow/x.py:2 print() in main",
    ]


def test_print_only_in_entry_point_mains():
    assert not print_violations(_modules()), "log through logging.getLogger(__name__) instead"


def test_the_library_does_not_configure_logging():
    bad = []
    for rel, tree in _modules():
        for name in ("basicConfig", "addHandler", "dictConfig", "fileConfig"):
            if rel != "utils/logging_utils.py":
                bad += [f"hybridflow/{rel}:{line} {name}()" for line, _ in calls(tree, name)]
    assert not bad, "entry points call hybridflow.utils.logging_utils.setup_cli_logging() in main()"


def test_generic_helpers_are_defined_once():
    defined: dict[str, list[str]] = {name: [] for name in DEFINED_ONCE}
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in defined:
                defined[node.name].append(rel)
    assert defined == {name: [rel] for name, rel in DEFINED_ONCE.items()}


# Below the entry points a config is a typed section read by attribute (docs/architecture.md, "Config").
# Skipped: the config package itself, the veRL compatibility and developer tools, the user's own tool and
# interaction config dicts (veRL's BaseTool / BaseInteraction API) and the main_* entry points.
STRING_READ_SKIPPED = ("config/", "compat/", "devtools/", "tools/", "interactions/")
# (module, name read) -> why that mapping is a plain dict and not a config section
STRING_READ_ALLOWED = {
    ("rewards/dapo.py", "cfg"): "veRL's DAPORewardManager(overlong_buffer_cfg=...): a user's reward_kwargs dict",
    ("single_controller/ray/init.py", "cfg"): "init_ray accepts veRL 0.9's ray_kwargs/ray_init mapping as it is",
    ("workers/rollout/vllm_settings.py", "cfg"): "the model's own config.json, read as a dict",
    ("utils/tool_config.py", "cfg"): "the user's tool config file (veRL's tool_config_path format)",
}


def _read_name(node: ast.AST) -> str | None:
    """The last name of ``node`` (``self.config`` -> ``config``; ``spec.config`` -> ``config``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_config_name(name: str | None) -> bool:
    return name is not None and ("config" in name.lower() or "cfg" in name.lower())


def config_string_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, name, key) of each ``<config>.get("key", ...)`` and ``<config>["key"]`` in ``tree``, where
    ``<config>``'s last name holds ``config`` or ``cfg``."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            target, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
            if not isinstance(key, str):
                continue
        else:
            continue
        name = _read_name(target)
        if _is_config_name(name):
            found.append((node.lineno, name, key))
    return sorted(found)


def config_string_read_violations(modules) -> list[str]:
    out = []
    for module, tree in modules:
        if module.startswith(STRING_READ_SKIPPED) or (module.startswith("main_") and "/" not in module):
            continue
        for line, name, key in config_string_reads(tree):
            if (module, name) not in STRING_READ_ALLOWED:
                out.append(f"{module}:{line}: {name}[{key!r}]")
    return out


def test_the_checker_finds_config_reads_by_string():
    planted = ast.parse(
        "def f(self, spec, data_config, optim_cfg, row, kwargs):\n"
        "    a = self.config.get('use_remove_padding', False)\n"
        "    b = spec.config['max_num_seqs']\n"
        "    c = data_config.get('custom_cls') or {}\n"
        "    d = optim_cfg['lr']\n"
        "    e = row.get('prompt'), kwargs['n'], self.config.use_remove_padding\n"
        "    g = self.config_list[0], data_config.get(name)\n"
    )
    assert [(n, k) for _, n, k in config_string_reads(planted)] == [
        ("config", "use_remove_padding"),
        ("config", "max_num_seqs"),
        ("data_config", "custom_cls"),
        ("optim_cfg", "lr"),
    ]
    assert config_string_read_violations([("workers/x.py", planted)])
    assert not config_string_read_violations([("config/x.py", planted), ("main_ppo.py", planted)])


def test_no_config_read_by_string_below_the_entry_points():
    violations = config_string_read_violations(_modules())
    assert not violations, "read the typed section's attribute instead:\n" + "\n".join(violations)


def test_no_merge_conflict_markers_in_tracked_files():
    """A merge resolved in a hurry once committed its markers into docs/measurements.md."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if listed.returncode != 0:
        import pytest

        pytest.skip("not a git checkout")
    found = []
    for name in listed.stdout.splitlines():
        if not name.endswith((".py", ".md", ".sh", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".jinja")):
            continue
        path = root / name
        if not path.is_file():
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "=======" and path.suffix != ".md":
                found.append(f"{name}:{i}: {line}")
    assert not found, "\n".join(found)
