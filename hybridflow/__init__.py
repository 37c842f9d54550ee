"""hybridflow: reinforcement fine-tuning of language models, the HybridFlow way."""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so that `import hybridflow` stays cheap (no torch import until DataProto is asked for).
    if name in ("DataProto", "DataProtoFuture"):
        from hybridflow import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


__all__ = ["DataProto", "DataProtoFuture", "__version__"]
