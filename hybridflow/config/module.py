"""veRL's ModuleConfig: a class or function of yours, named by the file (or module) and the name in it."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc

__all__ = ["ModuleConfig"]

_DATASET = (
    "a torch Dataset class from a Python file, built as veRL builds it (data_files, tokenizer, processor, config)"
)


@dataclass
class ModuleConfig(BaseConfig):
    """A user's code: ``path`` (a .py file or module) and ``name`` (the attribute in it)."""

    path: str | None = doc(None, "a .py file or an importable module; null: none", reason=_DATASET)
    name: str | None = doc(None, "the class or function in it", reason=_DATASET)
