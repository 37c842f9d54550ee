"""veRL's import path of ``BaseConfig`` (``verl.base_config``): a re-export of hybridflow.config's."""

from hybridflow.config.base import BaseConfig

__all__ = ["BaseConfig"]
