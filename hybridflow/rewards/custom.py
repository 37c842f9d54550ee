"""Load a user's scoring function from a Python file (veRL's ``custom_reward_function.path/.name``)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable

from hybridflow.utils.import_utils import user_file_spec


def get_custom_reward_fn(
    path: str | None, name: str = "compute_score", reward_kwargs: dict | None = None
) -> Callable | None:
    """The function ``name`` defined in the file ``path``, with ``reward_kwargs`` bound as defaults.

    Returns None when ``path`` is empty (no custom function configured). Call-time keyword
    arguments override the bound ones.
    """
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward function file not found: {path}")

    # A unique module name per file, so two files with the same basename do not collide.
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    module_name = f"hybridflow_custom_reward_{digest}"
    spec = user_file_spec(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets pickle/dataclasses inside the file resolve the module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        err.add_note(f"while loading the custom reward function file {path}")
        raise

    if not hasattr(module, name):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_") and getattr(value, "__module__", None) == module_name
        )
        raise AttributeError(
            f"custom reward function {name!r} not found in {path}; callables defined there: "
            f"{', '.join(defined) or '(none)'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"custom reward function {name!r} in {path} is a {type(fn).__name__}, not callable")

    bound = dict(reward_kwargs or {})
    if not bound:
        return fn

    @functools.wraps(fn)
    def with_kwargs(*args, **kwargs):
        return fn(*args, **{**bound, **kwargs})

    return with_kwargs
