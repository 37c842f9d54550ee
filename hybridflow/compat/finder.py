"""The import hook that serves ``hybridflow.compat.paths``: a meta-path finder, installed by ``import hybridflow``.

A path of ``MODULES`` loads as the module it names (the loader swaps that module into ``sys.modules``, so both
names give one object); a path of ``NAMES`` loads as a module whose names are looked up in their homes on
first use (module ``__getattr__``), or, where the path is a package on disk, as that package with the names
added. Nothing here imports the core: the homes are strings until a name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

from hybridflow.compat.paths import MODULES, NAMES


def _module_target(fullname: str) -> str | None:
    """The module that serves ``fullname``: a ``MODULES`` path, or a submodule of one (the longest path that
    holds it: ``...reward_score.math_reward`` before ``...reward_score``)."""
    for alias, home in sorted(MODULES.items(), key=lambda item: -len(item[0])):
        if fullname == alias or fullname.startswith(alias + "."):
            return home + fullname[len(alias) :]
    return None


def _has_children(fullname: str) -> bool:
    return any(p.startswith(fullname + ".") for p in (*MODULES, *NAMES))


def resolved_names(path: str) -> dict[str, tuple[str, str]]:
    """``{name: (home module, name there)}`` of a ``NAMES`` path, ``*`` expanded (imports the home);
    ``__getattr__`` (the fallback) is left out."""
    out = {}
    for home, spec in NAMES[path].items():
        for word in spec.split():
            if word == "*":
                out.update((n, (home, n)) for n in importlib.import_module(home).__all__)
            elif word != "__getattr__":
                alias, _, name = word.partition("=")
                out[alias] = (home, name or alias)
    return out


def _serve_names(module, path: str) -> None:
    """Give ``module`` the names of ``NAMES[path]``, each imported from its home when first asked for."""
    fallbacks = [home for home, spec in NAMES[path].items() if "__getattr__" in spec.split()]
    own_getattr = module.__dict__.get("__getattr__")
    table = None

    def __getattr__(name):
        nonlocal table
        if table is None:
            table = resolved_names(path)
        if name in table:
            home, original = table[name]
            value = getattr(importlib.import_module(home), original)
            setattr(module, name, value)
            return value
        for home in fallbacks:  # e.g. a refused Megatron class raises its reason
            importlib.import_module(home).__getattr__(name)
        if own_getattr is not None:
            return own_getattr(name)
        raise AttributeError(f"module {path!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(module.__dict__) | set(table or resolved_names(path)))

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
    if "*" not in " ".join(NAMES[path].values()):
        listed = [w.partition("=")[0] for spec in NAMES[path].values() for w in spec.split() if w != "__getattr__"]
        module.__all__ = [*module.__dict__.get("__all__", ()), *listed]
    else:  # the home's __all__ is known only once imported
        module.__all__ = [*module.__dict__.get("__all__", ()), *resolved_names(path)]


class _SameModule(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # the import system returns whatever sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _Names(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = f"veRL's import path {module.__name__!r}, served by hybridflow.compat.paths."
        _serve_names(module, module.__name__)


class _FileWithNames(importlib.abc.Loader):
    """A package on disk (its own loader does the work) that also serves the names of a ``NAMES`` path."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _serve_names(module, module.__name__)

    def __getattr__(self, name):  # get_resource_reader, get_source, ...: the file loader's
        return getattr(self.inner, name)


class VerlPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("hybridflow."):
            return None
        home = _module_target(fullname)
        if home is not None:
            return importlib.machinery.ModuleSpec(fullname, _SameModule(home))
        if fullname not in NAMES:
            return None
        on_disk = importlib.machinery.PathFinder.find_spec(fullname, path)
        if on_disk is not None and on_disk.loader is not None:
            on_disk.loader = _FileWithNames(on_disk.loader)
            return on_disk
        return importlib.machinery.ModuleSpec(fullname, _Names(), is_package=_has_children(fullname))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, VerlPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, VerlPathFinder())
