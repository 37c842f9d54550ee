"""Imports flow one way, down the layers of ``LAYERS`` (drawn in docs/architecture.md): no module imports
a package of its own layer or above, except the alias modules that offer veRL's import paths, which hold
re-exports only. Read from the source (AST), so an import inside a function counts too."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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
            found += (
                [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
                if base == "hybridflow"
                else [(node.lineno, base)]
            )
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
    assert sorted(found) == [
        (1, "hybridflow.trainer.ppo.core_algos"),
        (2, "hybridflow.trainer.ppo"),
        (4, "hybridflow.trainer"),
        (5, "hybridflow.utils"),
    ]


# Every top-level package (or module) of hybridflow, lowest layer first. A module may import its own
# package and any package of a lower layer, nothing of its own layer or above. docs/architecture.md draws
# the same list.
LAYERS = (
    ("utils", "protocol_layout"),  # generic helpers, the DataProto wire layout
    (
        "config",
        "base_config",
    ),  # the typed config sections, keys and loader (only generic helpers below); veRL's BaseConfig path
    ("protocol", "protocol_keys"),  # DataProto; the meta_info keys it carries between driver and workers
    ("algorithms", "rewards", "models"),  # pure RL math, scorers and the code sandbox, the tiny model
    ("tools", "interactions"),  # tool/user APIs (the gsm8k tool and interaction score with rewards.scorers)
    ("single_controller",),  # Worker, WorkerGroup, dispatch, Ray and in-process backends
    ("rollout",),  # what the agent loop knows of an engine: requests, answers, the server interface
    ("agent_loop",),  # trajectories over rollout servers
    ("workers", "data"),  # role workers with their engines (training, rollout servers); datasets
    ("trainer", "experimental"),  # the driver loop; veRL's experimental paths
    ("main_ppo", "main_generation", "main_eval", "main_sft", "model_merger", "plot", "devtools", "__init__"),
)
# modules that exist to offer veRL's import paths: they may point up, and hold re-exports only
ALIASES: tuple[str, ...] = (
    "hybridflow.base_config",
    "hybridflow.trainer.config",
    "hybridflow.workers.config",
    "hybridflow.utils.seqlen_balancing",
    "hybridflow.utils.dataset",
    "hybridflow.utils.reward_score",
    "hybridflow.utils.config",
)
# alias modules that are a package's __init__ only (veRL's ``verl.utils.omega_conf_to_dataclass``): the rest of
# the package is not an alias
PACKAGE_INIT_ALIASES: tuple[str, ...] = ("hybridflow.utils",)


def layer_of(module: str) -> int | None:
    top = module.split(".")[1] if module.count(".") else "__init__"
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


def top_level_names() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in PACKAGE_ROOT.iterdir()
        if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())
    }


def is_alias(module: str) -> bool:
    return module in PACKAGE_INIT_ALIASES or any(module == a or module.startswith(a + ".") for a in ALIASES)


def upward_imports() -> list[str]:
    """``path:line: A (layer i) imports B (layer j >= i)`` for every import that does not point down."""
    bad = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT.parent)
        name = ".".join(rel.with_suffix("").parts)
        own_top = name.split(".")[1]
        if is_alias(name.replace(".__init__", "")):
            continue
        mine = layer_of(name)
        for line, module in imported_modules(path.read_text(), name):
            if not module.startswith("hybridflow.") or module.split(".")[1] == own_top:
                continue
            theirs = layer_of(module)
            if theirs is None or theirs >= mine:
                bad.append(f"{rel}:{line}: {own_top} (layer {mine}) imports {module} (layer {theirs})")
    return bad


def test_every_top_level_package_has_a_layer():
    placed = {name for layer in LAYERS for name in layer}
    assert not top_level_names() - placed, (
        f"place these in LAYERS (and docs/architecture.md): {top_level_names() - placed}"
    )


def test_imports_only_point_down_the_layers():
    bad = upward_imports()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_alias_modules_hold_re_exports_only():
    """veRL's import paths (ALIASES) hold imports and ``__all__``, no logic."""
    for alias in ALIASES:
        base = PACKAGE_ROOT.parent / alias.replace(".", "/")
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        for path in files:
            if not path.exists():
                continue
            for node in ast.parse(path.read_text()).body:
                ok = (
                    isinstance(node, (ast.Import, ast.ImportFrom))
                    or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
                    or (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"])
                )
                assert ok, (
                    f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.lineno}: an alias module holds re-exports only"
                )


def test_the_layer_check_catches_a_back_arrow():
    """The rule is not vacuous: the check names an import of a higher layer (workers -> trainer)."""
    found = imported_modules("from hybridflow.trainer.ppo import ray_trainer\n", "hybridflow.workers.x")
    ((line, module),) = found
    assert layer_of(module) > layer_of("hybridflow.workers.x")


def test_workers_do_not_import_the_trainer():
    assert not violations(PACKAGE_ROOT / "workers", ("hybridflow.trainer",))


def test_the_config_package_imports_only_generic_helpers():
    """Just above the generic utils: every other layer may take its typed section from it."""
    others = tuple(f"hybridflow.{n}" for n in top_level_names() if n not in ("config", "utils"))
    assert not violations(
        PACKAGE_ROOT / "config", others + ("hybridflow.utils.config", "hybridflow.utils.reward_score")
    )


def test_algorithms_import_nothing_above_utils():
    above = (
        "hybridflow.trainer",
        "hybridflow.workers",
        "hybridflow.single_controller",
        "hybridflow.agent_loop",
        "hybridflow.protocol",
        "hybridflow.rewards",
        "hybridflow.data",
    )
    assert not violations(PACKAGE_ROOT / "algorithms", above)


def test_reward_scorers_and_the_sandbox_are_leaves():
    """Text in, a number out: the scorers import only the generic utils and each other (no torch, no
    reward manager), so a tool, an interaction or a veRL script can import one cheaply."""
    above = (
        "hybridflow.trainer",
        "hybridflow.workers",
        "hybridflow.single_controller",
        "hybridflow.agent_loop",
        "hybridflow.protocol",
        "hybridflow.data",
        "hybridflow.rewards.manager",
        "hybridflow.rewards.custom",
        "hybridflow.algorithms",
        "torch",
    )
    assert not violations(PACKAGE_ROOT / "rewards" / "scorers", above)
    for name in ("sandbox.py", "sandbox_child.py"):
        assert not [v for v in violations(PACKAGE_ROOT / "rewards", above) if f"rewards/{name}:" in v]
    code = "import sys, hybridflow.utils.reward_score.gsm8k, hybridflow.rewards.sandbox; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE_ROOT.parent
    ).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    "old, new",
    [
        ("hybridflow.utils.reward_score", "hybridflow.rewards.scorers"),
        ("hybridflow.utils.reward_score.gsm8k", "hybridflow.rewards.scorers.gsm8k"),
        ("hybridflow.utils.reward_score.math", "hybridflow.rewards.scorers.math"),
        ("hybridflow.utils.reward_score.code_sandbox", "hybridflow.rewards.scorers.code_sandbox"),
        ("hybridflow.trainer.ppo.core_algos", "hybridflow.algorithms"),
        ("hybridflow.trainer.ppo.algos", "hybridflow.algorithms"),
        ("hybridflow.trainer.ppo.algos.rollout_correction", "hybridflow.algorithms.rollout_correction"),
        ("hybridflow.trainer.ppo.algos.policy_loss", "hybridflow.algorithms.policy_loss"),
    ],
)
def test_old_import_paths_give_the_same_objects(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    names = [n for n in getattr(new_module, "__all__", dir(new_module)) if not n.startswith("_")]
    assert names
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), name


# ----------------------------------------------------------------------------- no backend branches
# Above the single controller nothing asks which backend it has (issue 23): the agent loop, the trainer
# and the entry points get groups from hybridflow.single_controller.factory and use what every group
# answers (handles, spawn_helpers, shutdown). They never name a backend's classes, import a backend's
# modules (or Ray itself), or tell handles apart by class.
ABOVE_THE_CONTROLLER = [PACKAGE_ROOT / "agent_loop", PACKAGE_ROOT / "trainer", *sorted(PACKAGE_ROOT.glob("main_*.py"))]
BACKEND_MODULES = ("ray", "hybridflow.single_controller.inprocess", "hybridflow.single_controller.ray")
BACKEND_CLASSES = {"InProcessWorkerGroup", "RayWorkerGroup", "RayResourcePool", "RayClassWithInitArgs"}
HANDLE_CLASSES = {"LocalServerHandle", "RayServerHandle", "LocalWeightTarget", "RayWeightTarget"}


def _names_in(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def backend_branches(source: str, module_name: str) -> list[str]:
    """``line: what`` for every way ``source`` could ask which backend it has."""
    found = [
        f"{line}: imports {m}"
        for line, m in imported_modules(source, module_name)
        if any(m == b or m.startswith(b + ".") for b in BACKEND_MODULES)
    ]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name in BACKEND_CLASSES]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in BACKEND_CLASSES:
                found.append(f"{node.lineno}: names {name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
            and _names_in(node.args[1]) & HANDLE_CLASSES
        ):
            found.append(f"{node.lineno}: isinstance against {sorted(_names_in(node.args[1]) & HANDLE_CLASSES)}")
    return sorted(set(found), key=lambda s: (int(s.split(":")[0]), s))


def test_the_backend_checker_sees_each_kind_of_branch():
    source = (
        "from hybridflow.single_controller.inprocess import InProcessWorkerGroup\n"
        "import ray\n"
        "def f(wg, servers):\n"
        "    from hybridflow.single_controller.ray.base import something\n"
        "    if isinstance(wg, single_controller.RayWorkerGroup): pass\n"
        "    local = isinstance(servers[0], (LocalServerHandle, int))\n"
        "from hybridflow.single_controller.factory import build_worker_group\n"
        "wg.handles(SERVER_HANDLE, role)\n"
    )
    found = backend_branches(source, "hybridflow.agent_loop.manager")
    # the factory import and the group's own methods are the allowed way
    assert found == [
        "1: imports InProcessWorkerGroup",
        "1: imports hybridflow.single_controller.inprocess",
        "2: imports ray",
        "4: imports hybridflow.single_controller.ray.base",
        "5: names RayWorkerGroup",
        "6: isinstance against ['LocalServerHandle']",
    ], found


def test_nothing_above_the_single_controller_asks_which_backend_it_has():
    bad = []
    for root in ABOVE_THE_CONTROLLER:
        for path in sorted([root] if root.is_file() else root.rglob("*.py")):
            name = ".".join(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
            bad += [f"{path.relative_to(PACKAGE_ROOT.parent)}:{b}" for b in backend_branches(path.read_text(), name)]
    assert not bad, (
        "backend branches above the single controller (use single_controller.factory and the "
        "WorkerGroup's handles / spawn_helpers):\n" + "\n".join(bad)
    )
