"""Compose every ``verl.trainer.main_ppo`` command line of a veRL ``examples/`` directory under
``hybridflow.main_ppo`` (the equivalent of ``--cfg job``: compose and check every key, no training).

    python -m hybridflow.devtools.check_verl_examples PATH/TO/verl/examples [--verbose] [--json OUT]

Each script (``*.sh``, ``*.slurm``, ``*.yaml``, ...) is read, not run (``shell_words``): variables set
in the script are expanded, ``$@`` and positional arguments are empty, ``$HOME`` is ``/root``, the
working directory (``$PWD``, ``$(pwd)``) is the parent of EXAMPLES (veRL's scripts run from there). An
override whose whole value is a variable the script never sets (``trainer.nnodes=$NNODES`` with NNODES
from the environment) is left out, so the key keeps hybridflow's default; a variable inside a longer
value (a path) is kept as the text ``UNSET_<NAME>``. ``--config-path``/``--config-name`` are kept;
a relative config path is looked up next to the script, then at the top of the veRL checkout.

Per command the verdict is OK (composes), REFUSED (a key set to something hybridflow does not
implement: the message says "not supported") or ERROR (anything else: an unknown key, a wrong type,
a variable that could not be substituted). Exit status: 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridflow.config.loader import parse_cli
from hybridflow.devtools.shell_words import UNSET, read_script

__all__ = ["find_commands", "check_command", "check_examples", "main"]

MODULE = "verl.trainer.main_ppo"
_REDIRECT = re.compile(r"^[0-9]*(>>?|<)(&[0-9])?")
_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch", ".yaml", ".yml", ".md")


@dataclass
class Result:
    script: str
    line: int
    verdict: str  # OK | REFUSED | ERROR
    message: str
    args: list[str]


def find_commands(path: Path, cwd: Path | None = None) -> list[tuple[int, list[str]]]:
    """(line, arguments after ``-m verl.trainer.main_ppo``) of every main_ppo command in a script
    meant to run from ``cwd`` (veRL's scripts: the top of the checkout)."""
    out = []
    reader = read_script(path, cwd)
    for command in reader.commands():
        if MODULE not in command.words:
            continue
        args = []
        for word in command.words[command.words.index(MODULE) + 1:]:
            if _REDIRECT.match(word):
                break
            args.append(word)
        out.append((command.line, args))
    return out


def _substitute_unset(args: list[str]) -> tuple[list[str], list[str]]:
    """Drop overrides whose whole value is an unset variable (the key keeps hybridflow's default);
    return (args, names of unset variables left inside values)."""
    kept, unresolved = [], []
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and re.fullmatch(rf"{UNSET}\w+", value.strip("'\"")):
            continue
        if UNSET in arg:
            unresolved += re.findall(rf"{UNSET}(\w+)", arg)
        kept.append(arg)
    return kept, unresolved


def _config_path(value: str, script: Path, examples: Path) -> str:
    path = Path(value)
    if UNSET in value or (path.is_absolute() and path.is_dir()):
        return value
    for base in () if path.is_absolute() else (script.parent, examples.parent, examples):
        if (base / path).is_dir():
            return str((base / path).resolve())
    parts = path.parts
    if "examples" in parts:  # e.g. verl/examples/x/config from a checkout cloned as ./verl
        inside = examples.joinpath(*parts[parts.index("examples") + 1:])
        if inside.is_dir():
            return str(inside.resolve())
    return value


def check_command(args: list[str], script: Path, examples: Path) -> tuple[str, str, list[str]]:
    """(verdict, message, the arguments given to hybridflow) for one command line."""
    args, unresolved = _substitute_unset(args)
    fixed, i = [], 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=")
        if flag in ("--config-path", "-cp"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            fixed.append(f"--config-path={_config_path(value, script, examples)}")
            continue
        fixed.append(arg)
        i += 1
    # veRL's own ppo_trainer: hybridflow's is the same tree, so the flags only name veRL's directory
    names = [a.partition("=")[2].strip("'\"") for a in fixed if a.startswith(("--config-name=", "-cn="))]
    if names and names[-1].removesuffix(".yaml") == "ppo_trainer":
        fixed = [a for a in fixed if not a.startswith(("--config-name=", "-cn=", "--config-path=", "-cp="))]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse_cli("ppo_trainer", fixed + ["--cfg", "job"])
            code = 0
        except SystemExit as e:
            code = e.code
        except Exception as e:  # a bug of ours: report it, keep checking the other scripts
            code, err = 3, io.StringIO(f"error: {type(e).__name__}: {e}")
    message = err.getvalue().strip()
    message = "\n".join(line for line in message.splitlines() if not line.startswith("[config]"))
    if code == 0:
        return "OK", "", fixed
    if unresolved and "not supported" not in message:
        message = f"unresolved shell variables {sorted(set(unresolved))}; {message}"
    return ("REFUSED" if "not supported" in message else "ERROR"), message, fixed


def check_examples(examples: Path) -> list[Result]:
    results = []
    for path in sorted(p for p in examples.rglob("*") if p.is_file() and p.suffix in _SUFFIXES):
        try:
            if MODULE not in path.read_text(errors="replace"):
                continue
            commands = find_commands(path, examples.parent)
        except (OSError, UnicodeError) as e:
            results.append(Result(str(path.relative_to(examples)), 0, "ERROR", f"cannot read: {e}", []))
            continue
        for line, args in commands:
            verdict, message, used = check_command(args, path, examples)
            results.append(Result(str(path.relative_to(examples)), line, verdict, message, used))
    return results


def _refused_keys(message: str) -> list[str]:
    return re.findall(r"^\s*([\w.\-]+)=.*? is not supported", message, re.M) + \
        re.findall(r"config '([\w\-]+)' \(veRL's\) is not supported", message)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path, help="a local copy of veRL's examples/ directory")
    parser.add_argument("--verbose", action="store_true", help="print every message in full")
    parser.add_argument("--json", type=Path, help="also write every result as JSON here")
    args = parser.parse_args(argv)
    results = check_examples(args.examples.resolve())
    for r in results:
        first = r.message.splitlines()
        detail = ("\n    " + "\n    ".join(first)) if args.verbose else (f"  {first[1].strip() if len(first) > 1 else first[0]}" if first else "")
        print(f"{r.verdict:8s} {r.script}:{r.line}{detail}")
    counts = Counter(r.verdict for r in results)
    scripts = len({r.script for r in results})
    print(f"\n{len(results)} main_ppo command lines in {scripts} files: " +
          ", ".join(f"{counts.get(v, 0)} {v}" for v in ("OK", "REFUSED", "ERROR")))
    keys = Counter(k for r in results if r.verdict == "REFUSED" for k in set(_refused_keys(r.message)))
    if keys:
        print("keys that refused most often: " + ", ".join(f"{k} ({n})" for k, n in keys.most_common(15)))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
