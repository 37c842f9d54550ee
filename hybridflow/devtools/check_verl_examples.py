"""Compose every ``verl.trainer.main_ppo`` command line of a veRL ``examples/`` directory under
``hybridflow.main_ppo`` (the equivalent of ``--cfg job``: compose and check every key, no training), and
likewise its SFT lines (``torchrun ... -m verl.trainer.sft_trainer``: ``hybridflow.main_sft``) and generation lines
(``verl.trainer.main_generation_server``: ppo_trainer's keys, its ``+data.output_path`` left out).

    python -m hybridflow.devtools.check_verl_examples PATH/TO/verl/examples [--verbose] [--json OUT]
        [--reference-python /work/verl_venv/bin/python]

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

``--reference-python`` names an interpreter that imports veRL: every line is then also judged by veRL's
own Hydra composition and ``validate_config`` (``verl_reference`` says exactly what "veRL accepts"
means), and the summary reads "hybridflow composes X of the Y that veRL accepts", with the keys that
refused among those Y. A line veRL rejects (a key its release no longer has, a typo) is no goal.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridflow.config.loader import parse_cli
from hybridflow.devtools import verl_reference
from hybridflow.devtools.shell_words import UNSET, read_script

__all__ = ["find_commands", "prepare_args", "check_command", "judge_with_verl", "check_examples", "summary", "main"]

MODULE = "verl.trainer.main_ppo"
# veRL's entry points read here -> (the hybridflow config their keys compose into, the entry's short name)
ENTRY_POINTS = {
    MODULE: ("ppo_trainer", "main_ppo"),
    "verl.trainer.sft_trainer": ("sft_trainer", "sft_trainer"),
    "verl.trainer.main_generation_server": ("ppo_trainer", "main_generation_server"),
}
_NOT_PPO_KEYS = ("data.output_path",)  # main_generation_server's own key, added with +
_REDIRECT = re.compile(r"^[0-9]*(>>?|<)(&[0-9])?")
_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch", ".yaml", ".yml", ".md")


@dataclass
class Result:
    script: str
    line: int
    verdict: str  # OK | REFUSED | ERROR
    message: str
    args: list[str]
    verl: str = ""  # ACCEPTS | REJECTS when veRL judged the line (--reference-python), else ""
    verl_message: str = ""
    entry: str = "main_ppo"  # the veRL entry point of the line (ENTRY_POINTS)


def find_commands(path: Path, cwd: Path | None = None, module: str = MODULE) -> list[tuple[int, list[str]]]:
    """(line, arguments after ``-m <module>``) of every command of that entry point in a script meant to run
    from ``cwd`` (veRL's scripts: the top of the checkout)."""
    out = []
    reader = read_script(path, cwd)
    for command in reader.commands():
        if module not in command.words:
            continue
        args = []
        for word in command.words[command.words.index(module) + 1 :]:
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
        inside = examples.joinpath(*parts[parts.index("examples") + 1 :])
        if inside.is_dir():
            return str(inside.resolve())
    return value


def prepare_args(args: list[str], script: Path, examples: Path, relative: bool = True) -> tuple[list[str], list[str]]:
    """(the command's arguments, names of unset variables left in values): overrides of unset
    variables dropped, ``--config-path`` made absolute (``relative=False``: only an absolute one is
    looked up, a relative one is kept for veRL's own resolution)."""
    args, unresolved = _substitute_unset(args)
    fixed, i = [], 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=")
        if flag in ("--config-path", "-cp"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            keep = not relative and not Path(value).is_absolute()
            fixed.append(f"--config-path={value if keep else _config_path(value, script, examples)}")
            continue
        fixed.append(arg)
        i += 1
    return fixed, unresolved


def check_command(
    args: list[str], script: Path, examples: Path, config: str = "ppo_trainer"
) -> tuple[str, str, list[str]]:
    """(verdict, message, the arguments given to hybridflow) for one command line composed into ``config``."""
    fixed, unresolved = prepare_args(args, script, examples)
    fixed = [a for a in fixed if a.lstrip("+").partition("=")[0] not in _NOT_PPO_KEYS]
    # veRL's own ppo_trainer: hybridflow's is the same tree, so the flags only name veRL's directory
    names = [a.partition("=")[2].strip("'\"") for a in fixed if a.startswith(("--config-name=", "-cn="))]
    if names and names[-1].removesuffix(".yaml") == "ppo_trainer":
        fixed = [a for a in fixed if not a.startswith(("--config-name=", "-cn=", "--config-path=", "-cp="))]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse_cli(config, fixed + ["--cfg", "job"])
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


def judge_with_verl(commands: list[list[str]], python: str, timeout: float = 1800) -> list[tuple[bool, str]]:
    """(accepted, why not) per command line, from veRL's own composition and validation, run by
    ``python`` (an interpreter that imports verl; see ``verl_reference``)."""
    if not commands:
        return []
    # -I: neither this checkout nor the user's PYTHONPATH leaks into veRL's interpreter
    code = f"import runpy; runpy.run_path({str(Path(verl_reference.__file__))!r}, run_name='__main__')"
    done = subprocess.run(
        [python, "-I", "-c", code],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not judge the commands with veRL:\n{done.stderr[-3000:]}")
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    return [(v["accepted"], v["message"]) for v in verdicts]


def check_examples(examples: Path, reference_python: str | None = None) -> list[Result]:
    """Every command line of veRL's entry points (``ENTRY_POINTS``) under ``examples``, composed by hybridflow
    and, with ``reference_python``, the main_ppo lines judged by veRL too (``Result.verl``)."""
    results, prepared = [], []
    for path in sorted(p for p in examples.rglob("*") if p.is_file() and p.suffix in _SUFFIXES):
        script = str(path.relative_to(examples))
        try:
            text = path.read_text(errors="replace")
            found = [
                (line, args, module)
                for module in ENTRY_POINTS
                if module in text
                for line, args in find_commands(path, examples.parent, module)
            ]
        except (OSError, UnicodeError) as e:
            results.append(Result(script, 0, "ERROR", f"cannot read: {e}", []))
            prepared.append(None)
            continue
        for line, args, module in sorted(found, key=lambda item: item[0]):
            config, entry = ENTRY_POINTS[module]
            verdict, message, used = check_command(args, path, examples, config)
            results.append(Result(script, line, verdict, message, used, entry=entry))
            # veRL resolves a relative --config-path itself: against verl/trainer/ (Hydra, python -m); its
            # judge (verl_reference) composes ppo_trainer only
            ppo = module == MODULE
            prepared.append(prepare_args(args, path, examples, relative=False)[0] if ppo else None)
    if reference_python:
        judged = [i for i, a in enumerate(prepared) if a is not None]
        for i, (accepted, message) in zip(judged, judge_with_verl([prepared[i] for i in judged], reference_python)):
            results[i].verl = "ACCEPTS" if accepted else "REJECTS"
            results[i].verl_message = message
    return results


def _refused_keys(message: str) -> list[str]:
    return re.findall(r"^\s*([\w.\-]+)=.*? is not supported", message, re.M) + re.findall(
        r"config '([\w\-]+)' \(veRL's\) is not supported", message
    )


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return (lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]) if lines else ""


def summary(results: list[Result]) -> list[str]:
    """The report's closing lines: counts, and the keys that refused most often (among the lines
    veRL accepts, when veRL judged them)."""
    out = []
    for entry in dict.fromkeys(r.entry for r in results):
        lines = [r for r in results if r.entry == entry]
        counts = Counter(r.verdict for r in lines)
        out.append(
            f"{len(lines)} {entry} command lines in {len({r.script for r in lines})} files: "
            + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("OK", "REFUSED", "ERROR"))
        )
    pool = results
    if any(r.verl for r in results):
        pool = [r for r in results if r.verl == "ACCEPTS"]
        ok = sum(r.verdict == "OK" for r in pool)
        out.append(
            f"veRL accepts {len(pool)} of {len(results)}; hybridflow composes {ok} of the {len(pool)} that veRL accepts"
        )
        rejected = Counter(_first_line(r.verl_message)[:160] for r in results if r.verl == "REJECTS")
        out += [f"  veRL rejects ({n}): {m}" for m, n in rejected.most_common()]
    keys = Counter(k for r in pool if r.verdict == "REFUSED" for k in set(_refused_keys(r.message)))
    if keys:
        out.append(
            "keys that refused"
            + (" (among those veRL accepts)" if pool is not results else "")
            + ", most often first: "
            + ", ".join(f"{k} ({n})" for k, n in keys.most_common())
        )
    errors = Counter(_first_line(r.message)[:160] for r in pool if r.verdict == "ERROR")
    out += [f"  ERROR ({n}): {m}" for m, n in errors.most_common()]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path, help="a local copy of veRL's examples/ directory")
    parser.add_argument("--verbose", action="store_true", help="print every message in full")
    parser.add_argument("--json", type=Path, help="also write every result as JSON here")
    parser.add_argument(
        "--reference-python",
        metavar="PYTHON",
        help="an interpreter that imports verl: judge every line with veRL's own config too "
        "(hybridflow/devtools/verl_reference.py says what 'veRL accepts' means)",
    )
    args = parser.parse_args(argv)
    results = check_examples(args.examples.resolve(), args.reference_python)
    for r in results:
        first = r.message.splitlines()
        detail = ("\n    " + "\n    ".join(first)) if args.verbose else (f"  {_first_line(r.message)}" if first else "")
        verl = f"verl:{r.verl:7s} " if r.verl else ""
        entry = "" if r.entry == "main_ppo" else f"[{r.entry}] "
        print(f"{r.verdict:8s} {verl}{entry}{r.script}:{r.line}{detail}")
        if args.verbose and r.verl == "REJECTS":
            print(f"    veRL: {r.verl_message}")
    print()
    print("\n".join(summary(results)))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
