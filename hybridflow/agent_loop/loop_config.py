"""Agent loops from a config file (``actor_rollout_ref.rollout.agent.agent_loop_config_path``), veRL's format::

    - name: math_expression                          # the agent_name samples use
      _target_: recipe.my_agent.MathExpressionAgentLoop   # or path/to/file.py:Class, or verl.... names
      min_terms: 2                                   # every other key: a constructor keyword argument

An entry may name a class that is also registered with ``@register``; the file's entry wins (and adds
its keyword arguments). A name given twice in the file is an error.
"""

from __future__ import annotations

import os

from hybridflow.agent_loop.base import AgentLoopBase
from hybridflow.config.convert import read_yaml_file
from hybridflow.utils.import_utils import load_class


def load_agent_loop_config(path: str) -> dict[str, tuple[type, dict]]:
    """agent name -> (loop class, constructor kwargs)."""
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"agent loop config file not found: {path} (actor_rollout_ref.rollout.agent.agent_loop_config_path)"
        )
    entries = read_yaml_file(path)
    if not isinstance(entries, list):
        raise ValueError(f"agent loop config {path}: expected a list of entries with 'name' and '_target_'")
    out: dict[str, tuple[type, dict]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"agent loop config {path}, entry {i}: needs 'name' and '_target_', got {entry!r}")
        entry = dict(entry)
        name, target = str(entry.pop("name")), entry.pop("_target_")
        if name in out:
            raise ValueError(f"agent loop config {path}: agent name {name!r} appears twice")
        cls = load_class(target, f"agent loop {name!r}", base_dir=os.path.dirname(os.path.abspath(path)))
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise TypeError(f"agent loop config {path}: {target!r} ({name!r}) is not an AgentLoopBase subclass")
        out[name] = (cls, entry)
    return out
