"""Interactions from a veRL-format yaml file (``actor_rollout_ref.rollout.multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                      # optional: default is the class name without "Interaction", lower case
        # or verl.interactions..., or file.py:Class
        class_name: hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

Each entry becomes ``cls(config={**config, "name": name})``; a sample picks one by
``extra_info.interaction_kwargs.name``. Duplicate names are an error.
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.config.convert import read_yaml_file
from hybridflow.utils.import_utils import load_class


def get_interaction_class(cls_name: str, base_dir: str | None = None) -> type:
    return load_class(cls_name, "interaction class", base_dir=base_dir)


def default_interaction_name(cls_name: str) -> str:
    short = str(cls_name).rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    return (short[: -len("Interaction")] if short.endswith("Interaction") else short).lower()


def _entries(path: str) -> list:
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"interaction config file not found: {path} (actor_rollout_ref.rollout.multi_turn.interaction_config_path)"
        )
    cfg = read_yaml_file(path)
    entries = cfg.get("interaction") if isinstance(cfg, dict) else None
    if entries is None:
        raise ValueError(f"interaction config {path}: expected a top-level 'interaction:' list")
    return list(entries)


def initialize_interactions_from_config(interaction_config_file: str, build: bool = True) -> dict[str, Any]:
    """name -> interaction object (or its class when ``build`` is False: start-up checks)."""
    path = os.path.expanduser(str(interaction_config_file))
    base_dir = os.path.dirname(os.path.abspath(path))
    out: dict[str, Any] = {}
    for i, entry in enumerate(_entries(path)):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"interaction config {path}, interaction[{i}]: no class_name")
        cls = get_interaction_class(entry["class_name"], base_dir)
        name = entry.get("name") or default_interaction_name(entry["class_name"])
        if name in out:
            raise ValueError(f"interaction config {path}: duplicate interaction name {name!r}")
        config = dict(entry.get("config") or {})
        config["name"] = name
        out[name] = cls(config=config) if build else cls
    return out
