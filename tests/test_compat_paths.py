"""veRL's import paths (``hybridflow.workers.config``, ``hybridflow.utils.reward_score``, ...) are one table,
``hybridflow.compat.paths``, served by an import hook that ``import hybridflow`` installs: each path imports
and gives hybridflow's own objects, no file of the core is an alias, and the core never imports through one."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.compat.finder import resolved_names
from hybridflow.compat.paths import MODULES, NAMES

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "hybridflow"

# every veRL path that worked when the table replaced the alias files (issue 34): none may go missing
VERL_PATHS = [
    "hybridflow.base_config",
    "hybridflow.experimental",
    "hybridflow.experimental.agent_loop",
    "hybridflow.experimental.agent_loop.agent_loop",
    "hybridflow.experimental.agent_loop.single_turn_agent_loop",
    "hybridflow.experimental.agent_loop.tool_agent_loop",
    "hybridflow.experimental.agent_loop.tool_parser",
    "hybridflow.tools.schemas",
    "hybridflow.tools.utils",
    "hybridflow.tools.utils.tool_registry",
    "hybridflow.utils.tensordict_utils",
    "hybridflow.utils.device",
    "hybridflow.trainer.config",
    "hybridflow.trainer.config.algorithm",
    "hybridflow.trainer.config.config",
    "hybridflow.trainer.ppo.core_algos",
    "hybridflow.trainer.ppo.algos",
    "hybridflow.trainer.ppo.algos.advantage",
    "hybridflow.trainer.ppo.algos.kl",
    "hybridflow.trainer.ppo.algos.loss_agg",
    "hybridflow.trainer.ppo.algos.policy_loss",
    "hybridflow.trainer.ppo.algos.rollout_correction",
    "hybridflow.trainer.ppo.algos.rollout_correction_metrics",
    "hybridflow.trainer.ppo.algos.value_loss",
    "hybridflow.utils.config",
    "hybridflow.utils.dataset",
    "hybridflow.utils.dataset.rl_dataset",
    "hybridflow.utils.reward_score",
    "hybridflow.utils.reward_score.code_sandbox",
    "hybridflow.utils.reward_score.gsm8k",
    "hybridflow.utils.reward_score.math",
    "hybridflow.utils.seqlen_balancing",
    "hybridflow.workers.config",
    "hybridflow.workers.config.actor",
    "hybridflow.workers.config.critic",
    "hybridflow.workers.config.engine",
    "hybridflow.workers.config.model",
    "hybridflow.workers.config.optimizer",
    "hybridflow.workers.config.rollout",
    "hybridflow.workers.fsdp_workers",
    "hybridflow.workers.reward_manager",
    "hybridflow.workers.reward_manager.registry",
]


def _on_disk(path: str) -> Path | None:
    base = PACKAGE_ROOT.parent / path.replace(".", "/")
    return next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.exists()), None)


@pytest.mark.parametrize("path", VERL_PATHS)
def test_every_verl_path_imports(path):
    module = importlib.import_module(path)
    for name in getattr(module, "__all__", ()):
        assert getattr(module, name) is not None, f"{path}.{name}"


@pytest.mark.parametrize("path", sorted(MODULES))
def test_a_module_path_is_the_very_module_it_names(path):
    assert importlib.import_module(path) is importlib.import_module(MODULES[path])


@pytest.mark.parametrize("path", sorted(NAMES))
def test_a_names_path_gives_the_objects_of_their_homes(path):
    module = importlib.import_module(path)
    for name, (home, original) in resolved_names(path).items():
        assert getattr(module, name) is getattr(importlib.import_module(home), original), f"{path}.{name}"
    if "__getattr__" in " ".join(NAMES[path].values()):  # the refused Megatron classes still say why
        with pytest.raises(Exception, match="Megatron"):
            module.McoreActorConfig  # noqa: B018
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_a_renamed_name_and_a_submodule_of_a_module_path():
    from hybridflow.agent_loop.server_manager import ServerManager
    from hybridflow.experimental.agent_loop.agent_loop import AsyncLLMServerManager
    from hybridflow.rewards.scorers import gsm8k
    from hybridflow.utils.reward_score import gsm8k as verl_gsm8k

    assert AsyncLLMServerManager is ServerManager and verl_gsm8k is gsm8k


def test_no_file_of_the_core_is_an_alias():
    """A served path has no file, except a package on disk that holds something else (the generic helpers of
    hybridflow.utils, veRL's yaml tree): its __init__ holds a docstring only."""
    for path in (*MODULES, *NAMES):
        file = _on_disk(path)
        if file is None:
            continue
        body = ast.parse(file.read_text()).body
        assert file.name == "__init__.py" and all(isinstance(n, ast.Expr) for n in body), file


def _imports(path: Path, name: str) -> list[tuple[int, str, list[str]]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            out.append((node.lineno, base, [a.name for a in node.names]))
    return out


def test_the_core_never_imports_through_a_verl_path():
    served = [*MODULES, *(p for p in NAMES if _on_disk(p) is None)]
    bad = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT.parent)
        if rel.parts[1] == "compat":
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for line, module, names in _imports(path, name):
            targets = [module, *(f"{module}.{n}" for n in names)]
            if any(t == s or t.startswith(s + ".") for t in targets for s in served):
                bad.append(f"{rel}:{line} imports {module}")
            elif module in NAMES:  # a package on disk: its own modules are fine, the served names are not
                served_names = {w.partition("=")[0] for spec in NAMES[module].values() for w in spec.split()}
                bad += [f"{rel}:{line} imports {module}.{n}" for n in names if n in served_names]
    assert not bad, "import the home, not veRL's path:\n" + "\n".join(bad)


def test_compat_imports_nothing_of_the_core():
    """The table names its homes as strings: importing hybridflow (which installs the hook) stays cheap."""
    for path in sorted((PACKAGE_ROOT / "compat").glob("*.py")):
        for line, module, _ in _imports(path, f"hybridflow.compat.{path.stem}"):
            assert not module.startswith("hybridflow.") or module.startswith("hybridflow.compat"), (
                f"{path.name}:{line} imports {module}"
            )


def test_a_fresh_process_gets_the_paths_from_import_hybridflow_alone():
    code = (
        "import sys\n"
        "from hybridflow.workers.config.actor import FSDPActorConfig\n"
        "from hybridflow.utils import omega_conf_to_dataclass\n"
        "import hybridflow.config\n"
        "assert FSDPActorConfig is hybridflow.config.FSDPActorConfig\n"
        "assert omega_conf_to_dataclass is hybridflow.config.omega_conf_to_dataclass\n"
        "import importlib.resources as r\n"
        "print(r.files('hybridflow.trainer.config').joinpath('actor/dp_actor.yaml').is_file())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE_ROOT.parent
    ).stdout
    assert out.strip() == "True"


# veRL 0.9.1's config classes by the path veRL exports them from: hybridflow provides each or refuses it by name
VERL_CONFIG_CLASSES = [
    ("hybridflow.workers.config", "ServerConfig", None),
    ("hybridflow.workers.config.rollout", "ServerConfig", None),
    ("hybridflow.trainer.config", "ProfileConfig", "profiler"),
    ("hybridflow.trainer.config.config", "ProfileConfig", "profiler"),
    ("hybridflow.trainer.config", "BaseModelConfig", "HFModelConfig"),
    ("hybridflow.workers.config", "FSDPCriticModelCfg", "CriticModelConfig"),
    ("hybridflow.workers.config.critic", "FSDPCriticModelCfg", "CriticModelConfig"),
    ("hybridflow.workers.config", "TrainingWorkerConfig", "TrainingWorker"),
    ("hybridflow.workers.config.engine", "EngineConfig", "FSDPEngineConfig"),
    ("hybridflow.workers.config.engine", "EngineRouterReplayConfig", "TrainingWorker"),
]


@pytest.mark.parametrize("path, name, reason", VERL_CONFIG_CLASSES)
def test_veRLs_config_classes_are_provided_or_refused_by_name(path, name, reason):
    if reason is None:
        module = importlib.import_module(path)
        assert getattr(module, name).__name__ == name
        return
    with pytest.raises(ImportError, match=rf"{name} \(veRL's config class\) is not supported.*{reason}"):
        exec(f"from {path} import {name}", {})
