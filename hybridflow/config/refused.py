"""veRL config classes hybridflow does not have (other training engines, veRL's engine worker, earlier
sections its trainers no longer read), refused by name (an import or a ``_target_``) with the reason of
the matching config keys, so the user learns a feature is missing, not that a name was misspelt. The
alias modules take ``__getattr__`` from here."""

from __future__ import annotations

from hybridflow.config.errors import ConfigError

__all__ = [
    "MEGATRON",
    "OTHER_ENGINES",
    "ENGINE_WORKER",
    "REFUSED_CLASSES",
    "RefusedConfigClass",
    "refusal",
    "__getattr__",
]

MEGATRON = "Megatron is not a hybridflow training engine (FSDP2/DDP only)"
OTHER_ENGINES = "TorchTitan, VeOmni and Automodel are not hybridflow training engines (FSDP2/DDP only)"
ENGINE_WORKER = (
    "veRL's model-engine worker (TrainingWorker) and its engine sections are not hybridflow's workers: a role is "
    "configured by its own section (actor, ref, critic; the FSDP engine in fsdp_config: FSDPEngineConfig)"
)

# veRL 0.9.1's config classes of those engines -> why hybridflow has no such class
REFUSED_CLASSES: dict[str, str] = {
    **dict.fromkeys(
        "McoreActorConfig McoreCriticConfig McoreEngineConfig McoreOptimizerConfig McoreCheckpointConfig "
        "MegatronPeftConfig".split(),
        MEGATRON,
    ),
    **dict.fromkeys(
        "TorchTitanActorConfig TorchTitanCriticConfig TorchtitanEngineConfig TorchtitanOptimizerConfig "
        "VeOmniActorConfig VeOmniCriticConfig VeOmniEngineConfig VeOmniOptimizerConfig AutomodelEngineConfig "
        "AutomodelOptimizerConfig".split(),
        OTHER_ENGINES,
    ),
    **dict.fromkeys(("TrainingWorkerConfig", "EngineConfig", "EngineRouterReplayConfig"), ENGINE_WORKER),
    "ProfileConfig": "veRL's earlier profiling section, which its trainers no longer read; profiling is "
    "global_profiler and each role's profiler section (ProfilerConfig)",
    **dict.fromkeys(
        ("BaseModelConfig", "FSDPCriticModelCfg"),
        "veRL's earlier model section, which its trainers no longer read; the model sections are HFModelConfig "
        "(actor_rollout_ref.model) and CriticModelConfig (critic.model)",
    ),
}


class RefusedConfigClass(ImportError, ConfigError):
    """A veRL config class of an engine hybridflow does not implement (an ImportError for ``from ...
    import``, a ConfigError for ``_target_``)."""


def refusal(name: str) -> RefusedConfigClass:
    return RefusedConfigClass(f"{name} (veRL's config class) is not supported by hybridflow: {REFUSED_CLASSES[name]}")


def __getattr__(name: str):
    """Module ``__getattr__`` for the alias modules: a refused class name raises its reason."""
    if name in REFUSED_CLASSES:
        raise refusal(name)
    raise AttributeError(name)
