"""``trainer.checkpoint_callback_class``: a hook of the user's that runs on the driver after each complete save.

A checkpoint is worth something only once it is somewhere safe or registered; the hook is where a user uploads
it or records a model version, at the moment the folder is whole (renamed into place, the tracker written)
and before training goes on. It runs in the driver process, after the workers' writes.

The class is named as ``pkg.module.Class`` (veRL's form; a ``verl.`` path is read as hybridflow's) or
``path/to/file.py:Class``. It is built once, with the run's typed configuration (``config=``), and its
``on_save(trainer=, global_step=, checkpoint_dir=, async_save=False)`` is called with keywords, so a hook
written for veRL 0.9 runs unchanged. An exception from the hook ends the run (as in veRL): a failed upload
must not pass silently. The checkpoint it was given is complete on disk either way.
"""

from __future__ import annotations

from typing import Any

from hybridflow.utils.import_utils import load_class

KEY = "trainer.checkpoint_callback_class"


class CheckpointCallback:
    """The hook's base class: does nothing. Subclass it and override ``on_save``; accept ``**kwargs`` there so
    later versions can pass more context."""

    def __init__(self, config=None):
        self.config = config

    def on_save(self, trainer, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs) -> None:
        """Called after the save of ``global_step`` into ``checkpoint_dir`` (the complete ``global_step_N``
        folder). ``async_save`` is always False in hybridflow: its saves are finished when this runs."""


def checkpoint_callback_class(reference: str | None) -> type:
    """The class ``reference`` names (CheckpointCallback when empty); errors name the key."""
    if not reference:
        return CheckpointCallback
    try:
        cls = load_class(reference, KEY)
    except (OSError, ImportError) as err:
        err.add_note(f"while loading {KEY}={reference!r}")
        raise
    if not isinstance(cls, type) or not callable(getattr(cls, "on_save", None)):
        raise TypeError(
            f"{KEY}={reference!r} is a {type(cls).__name__} without an on_save method; expected a class like "
            "hybridflow.trainer.checkpoint_callback.CheckpointCallback"
        )
    return cls


def build_checkpoint_callback(config: Any) -> CheckpointCallback:
    """The run's hook, built with the run's configuration (``config.trainer.checkpoint_callback_class``)."""
    return checkpoint_callback_class(config.trainer.checkpoint_callback_class)(config=config)
