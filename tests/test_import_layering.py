"""Imports flow one way: the workers never import the driver (hybridflow.trainer), and the pure RL
math (hybridflow.algorithms) imports nothing of hybridflow above utils. Read from the source (AST),
so an import inside a function counts too. veRL's import paths keep working as re-exports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "hybridflow"


def imported_modules(source: str, module_name: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import statement in ``source``; relative imports are
    resolved against ``module_name`` (the importing module's dotted name)."""
    package = module_name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            # `from hybridflow import trainer` imports the subpackage
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names] if base == "hybridflow" \
                else [(node.lineno, base)]
    return found


def violations(package_dir: Path, forbidden: tuple[str, ...]) -> list[str]:
    """``path:line module`` for every import of a module under one of the ``forbidden`` prefixes."""
    bad = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT.parent)
        # a package's __init__ keeps its ".__init__": its relative imports resolve against the package
        name = ".".join(rel.with_suffix("").parts)
        for line, module in imported_modules(path.read_text(), name):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{rel}:{line} imports {module}")
    return bad


def test_the_checker_sees_absolute_relative_and_nested_imports():
    source = (
        "import hybridflow.trainer.ppo.core_algos\n"
        "from ...trainer.ppo import core_algos\n"
        "def f():\n    from hybridflow import trainer\n"
        "from hybridflow.utils import registry\n"
    )
    found = imported_modules(source, "hybridflow.workers.actor.dp_actor")
    # `...` from hybridflow/workers/actor/dp_actor.py is the hybridflow package
    assert sorted(found) == [(1, "hybridflow.trainer.ppo.core_algos"), (2, "hybridflow.trainer.ppo"),
                             (4, "hybridflow.trainer"), (5, "hybridflow.utils")]


def test_workers_do_not_import_the_trainer():
    assert not violations(PACKAGE_ROOT / "workers", ("hybridflow.trainer",))


def test_algorithms_import_nothing_above_utils():
    above = ("hybridflow.trainer", "hybridflow.workers", "hybridflow.single_controller", "hybridflow.agent_loop",
             "hybridflow.protocol", "hybridflow.rewards", "hybridflow.data")
    assert not violations(PACKAGE_ROOT / "algorithms", above)


@pytest.mark.parametrize("old, new", [
    ("hybridflow.trainer.ppo.core_algos", "hybridflow.algorithms"),
    ("hybridflow.trainer.ppo.algos", "hybridflow.algorithms"),
    ("hybridflow.trainer.ppo.algos.rollout_correction", "hybridflow.algorithms.rollout_correction"),
    ("hybridflow.trainer.ppo.algos.policy_loss", "hybridflow.algorithms.policy_loss"),
])
def test_old_import_paths_give_the_same_objects(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    names = [n for n in getattr(new_module, "__all__", dir(new_module)) if not n.startswith("_")]
    assert names
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), name
