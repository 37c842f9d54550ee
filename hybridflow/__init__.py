"""hybridflow: reinforcement fine-tuning of language models, the HybridFlow way."""

from hybridflow.compat.finder import install as _install_verl_paths

__version__ = "0.1.0"

_install_verl_paths()  # veRL's import paths (hybridflow.workers.config, ...), served by hybridflow.compat


def __getattr__(name):
    # Lazy so that `import hybridflow` stays cheap (no torch import until DataProto is asked for).
    if name in ("DataProto", "DataProtoFuture"):
        from hybridflow import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


__all__ = ["DataProto", "DataProtoFuture", "__version__"]
