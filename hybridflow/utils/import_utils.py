"""Load a user's class (a tool, an interaction, an agent loop) named in a config file.

veRL's yaml files name classes by their dotted import path (``class_name: "verl.tools.gsm8k_tool.Gsm8kTool"``,
``_target_: recipe.my_agent.MyAgentLoop``); a class may also live in a plain Python file. Accepted:

- ``package.module.ClassName``: imported normally (the package must be importable);
- ``/path/to/file.py:ClassName`` or ``/path/to/file.py.ClassName`` (a file path, absolute or relative
  to the working directory or to ``base_dir``, e.g. the folder of the yaml that names it);
- ``verl.<module>.<ClassName>`` where veRL itself is not installed: the same module under
  ``hybridflow.`` (``verl.tools.gsm8k_tool.Gsm8kTool`` -> ``hybridflow.tools.gsm8k_tool.Gsm8kTool``), so
  veRL's example yaml files work unchanged.

A name that cannot be loaded raises ImportError saying what was tried.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any


def load_module_from_file(path: str) -> Any:
    """Import the Python file ``path`` once per process, under a name derived from its absolute path."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise ImportError(f"no such Python file: {path}")
    name = (
        f"hybridflow_user_{os.path.splitext(os.path.basename(path))[0]}_{hashlib.sha1(path.encode()).hexdigest()[:10]}"
    )
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes defined there must be importable by name (pickling to Ray workers)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _split_file_reference(reference: str) -> tuple[str, str] | None:
    """(file, attribute) when ``reference`` names a .py file, else None."""
    if ":" in reference and reference.rsplit(":", 1)[0].endswith(".py"):
        path, attr = reference.rsplit(":", 1)
        return path, attr
    if ".py." in reference:
        path, attr = reference.rsplit(".", 1)
        return path, attr
    return None


def _resolve_path(path: str, base_dir: str | None) -> str:
    path = os.path.expanduser(path)
    if os.path.isabs(path) or os.path.isfile(path) or base_dir is None:
        return path
    candidate = os.path.join(base_dir, path)
    return candidate if os.path.isfile(candidate) else path


def load_class(reference: str, what: str = "class", base_dir: str | None = None) -> Any:
    """The object named by ``reference`` (see the module docstring). ``what`` names it in errors."""
    reference = str(reference).strip()
    file_ref = _split_file_reference(reference)
    if file_ref is not None:
        path, attr = file_ref
        module = load_module_from_file(_resolve_path(path, base_dir))
        if not hasattr(module, attr):
            raise ImportError(f"{what} {reference!r}: {path} defines no {attr!r}")
        return getattr(module, attr)
    if "." not in reference:
        raise ImportError(f"{what} {reference!r} is neither 'package.module.ClassName' nor 'path/to/file.py:ClassName'")
    module_name, attr = reference.rsplit(".", 1)
    tried = [module_name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if not (module_name.startswith("verl.") and e.name and e.name.split(".")[0] == "verl"):
            raise ImportError(f"{what} {reference!r}: cannot import module {module_name!r} ({e})") from e
        alias = "hybridflow." + module_name[len("verl.") :]
        tried.append(alias)
        try:
            module = importlib.import_module(alias)
        except ModuleNotFoundError:
            raise ImportError(
                f"{what} {reference!r}: veRL is not installed and hybridflow has no {alias!r} "
                f"(tried {', '.join(tried)})"
            ) from None
    if not hasattr(module, attr):
        raise ImportError(f"{what} {reference!r}: module {module.__name__!r} defines no {attr!r}")
    return getattr(module, attr)
