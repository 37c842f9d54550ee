"""Imports flow one way, down the layers of ``LAYERS`` (drawn in docs/architecture.md): no module imports
a package of its own layer or above, and no two modules or packages import each other. veRL's import paths
are not files of the core but the table of ``hybridflow.compat``, which nothing of the core imports through.
Read from the source (AST), so an import inside a function counts too."""

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
    ("config",),  # the typed config sections, keys and loader (only generic helpers below)
    ("protocol", "protocol_keys"),  # DataProto; the meta_info keys it carries between driver and workers
    ("algorithms", "rewards", "models"),  # pure RL math, scorers and the code sandbox, the tiny model
    ("tools", "interactions"),  # tool/user APIs (the gsm8k tool and interaction score with rewards.scorers)
    ("single_controller",),  # Worker, WorkerGroup, dispatch, Ray and in-process backends
    ("rollout",),  # what the agent loop knows of an engine: requests, answers, the server interface
    ("agent_loop",),  # trajectories over rollout servers
    ("workers", "data"),  # role workers with their engines (training, rollout servers); datasets
    ("trainer",),  # the driver loop
    ("compat",),  # veRL's import paths: a table of what serves each, above everything it names
    (
        "main_ppo",
        "main_generation",
        "main_generation_server",
        "main_eval",
        "main_sft",
        "model_merger",
        "plot",
        "devtools",
        "__init__",
    ),
)


def layer_of(module: str) -> int | None:
    top = module.split(".")[1] if module.count(".") else "__init__"
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


def top_level_names() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in PACKAGE_ROOT.iterdir()
        if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())
    }


def upward_imports() -> list[str]:
    """``path:line: A (layer i) imports B (layer j >= i)`` for every import that does not point down."""
    bad = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT.parent)
        name = ".".join(rel.with_suffix("").parts)
        own_top = name.split(".")[1]
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


def test_the_layer_check_catches_a_back_arrow():
    """The rule is not vacuous: the check names an import of a higher layer (workers -> trainer)."""
    found = imported_modules("from hybridflow.trainer.ppo import ray_trainer\n", "hybridflow.workers.x")
    ((line, module),) = found
    assert layer_of(module) > layer_of("hybridflow.workers.x")


# ----------------------------------------------------------------------------- no cycles
# An edge A -> B for every import statement in A that names module B (``from pkg import name`` names
# ``pkg.name`` where that is a module); imports inside functions and under TYPE_CHECKING count too, since
# they tie the two modules together as much as a top-level one. Importing ``a.b.c`` is no edge to the
# packages ``a`` and ``a.b`` (their __init__ runs, but that is the package holding its parts, not a use).


def module_files() -> dict[str, Path]:
    """Dotted name -> file of every module of hybridflow (a package under its own name)."""
    out = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(source: str, name: str, is_package: bool, files) -> set[str]:
    """The hybridflow modules (names in ``files``) that the module ``name`` with this ``source`` imports."""

    def known(target: str) -> str | None:
        while target and target not in files:
            target = target.rpartition(".")[0]
        return target or None

    package = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
    return {t for t in map(known, (t for t in targets if t.startswith("hybridflow"))) if t and t != name}


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the hybridflow modules it imports (see above)."""
    return {name: imports_of(p.read_text(), name, p.name == "__init__.py", files) for name, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graphs(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Per package, the graph of its children (subpackages and modules): child A -> child B when anything
    in A imports anything in B."""
    out: dict[str, dict[str, set[str]]] = {}
    for a, targets in graph.items():
        for b in targets:
            pa, pb = a.split("."), b.split(".")
            k = 0
            while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
                k += 1
            if k < len(pa) and k < len(pb):  # neither contains the other
                out.setdefault(".".join(pa[:k]), {}).setdefault(".".join(pa[: k + 1]), set()).add(".".join(pb[: k + 1]))
    return out


def test_the_cycle_check_sees_module_and_package_cycles():
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.b.z"}, "p.b.z": {"p.a.w"}, "p.a.w": set(), "p.c": {"p.c.d"}}
    assert cycles(graph) == []  # x -> y -> z -> w: no module cycle ...
    assert cycles(package_graphs(graph)["p"]) == [["p.a", "p.b"]]  # ... but a and b import each other
    assert cycles({**graph, "p.a.w": {"p.a.x"}}) == [["p.a.w", "p.a.x", "p.b.y", "p.b.z"]]
    source = "def f():\n    from hybridflow.rewards import dapo\n"  # lazy, and a module named by from-import
    files = {"hybridflow.rewards", "hybridflow.rewards.dapo", "hybridflow.rewards.manager"}
    assert imports_of(source, "hybridflow.rewards.manager", False, files) == {"hybridflow.rewards.dapo"}


def test_no_two_modules_import_each_other():
    found = cycles(import_graph(module_files()))
    assert not found, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_two_packages_import_each_other():
    found = [
        f"in {parent}: " + " <-> ".join(c)
        for parent, children in sorted(package_graphs(import_graph(module_files())).items())
        for c in cycles(children)
    ]
    assert not found, "import cycles between packages:\n" + "\n".join(found)


def test_data_imports_neither_the_agent_loop_nor_the_tools():
    """What datasets share with them (the chat template's token deltas, the tool yaml) sits in utils."""
    assert not violations(PACKAGE_ROOT / "data", ("hybridflow.agent_loop", "hybridflow.tools"))


def test_workers_do_not_import_the_trainer():
    assert not violations(PACKAGE_ROOT / "workers", ("hybridflow.trainer",))


def test_the_config_package_imports_only_generic_helpers():
    """Just above the generic utils: every other layer may take its typed section from it."""
    others = tuple(f"hybridflow.{n}" for n in top_level_names() if n not in ("config", "utils"))
    assert not violations(
        PACKAGE_ROOT / "config", others + ("hybridflow.utils.config", "hybridflow.utils.reward_score")
    )


# where a composed OmegaConf tree may be read: the config package (the loader, the doors' converter), the entry
# points (they compose the yaml and read it into their typed tree once) and the maintainers' devtools
OMEGACONF_READERS = ("config", "main_ppo", "main_sft", "main_generation", "main_eval", "devtools")


def omegaconf_importers(package_dir: Path = PACKAGE_ROOT) -> list[str]:
    """``path:line`` of every import of omegaconf outside OMEGACONF_READERS."""
    bad = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent)
        if rel.parts[1].removesuffix(".py") in OMEGACONF_READERS:
            continue
        name = ".".join(rel.with_suffix("").parts)
        bad += [
            f"{rel}:{line}"
            for line, module in imported_modules(path.read_text(), name)
            if module == "omegaconf" or module.startswith("omegaconf.")
        ]
    return bad


def test_below_the_entry_points_nothing_imports_omegaconf():
    """The trainer, the workers, the agent loop, the datasets... take typed sections; veRL's doors that accept
    a DictConfig convert it with hybridflow.config's ``as_section`` (omegaconf stays in config/)."""
    assert omegaconf_importers() == []


def test_the_omegaconf_check_sees_an_import(tmp_path):
    module = tmp_path / "hybridflow" / "workers" / "sneaky.py"
    module.parent.mkdir(parents=True)
    module.write_text("def f():\n    from omegaconf import OmegaConf\n")
    (tmp_path / "hybridflow" / "main_ppo.py").write_text("import omegaconf\n")
    assert omegaconf_importers(tmp_path / "hybridflow") == ["hybridflow/workers/sneaky.py:2"]


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
        "hybridflow.rewards.rule_manager",
        "hybridflow.rewards.registry",
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
