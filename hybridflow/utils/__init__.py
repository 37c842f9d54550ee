"""Generic helpers. ``omega_conf_to_dataclass`` is here under veRL's name (``verl.utils``), loaded on first
use so that importing a helper module does not import omegaconf."""


def __getattr__(name):
    if name == "omega_conf_to_dataclass":
        from hybridflow.config.convert import omega_conf_to_dataclass

        return omega_conf_to_dataclass
    raise AttributeError(f"module 'hybridflow.utils' has no attribute {name!r}")


__all__ = ["omega_conf_to_dataclass"]
