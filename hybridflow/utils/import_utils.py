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

A user's Python file (a reward function, a reward manager, a tool, an engine, a dataset class) loads through
``user_file_spec``: where veRL is not installed, its ``import verl...`` / ``from verl... import`` statements
(module level or inside functions) read ``hybridflow...`` instead, so a file written for veRL runs unchanged
against the paths hybridflow serves (``hybridflow.compat``). Nothing outside the file changes: no ``verl``
module appears in ``sys.modules``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
from typing import Any


class _VerlImports(ast.NodeTransformer):
    """``verl`` as the first part of an absolute import becomes ``hybridflow``; ``import verl.x`` (which binds
    the name ``verl``) binds it to ``hybridflow`` as well."""

    def visit_Import(self, node: ast.Import):
        out, binds_verl = [], False
        for alias in node.names:
            if alias.name == "verl" or alias.name.startswith("verl."):
                renamed = "hybridflow" + alias.name[len("verl") :]
                if alias.asname is None:
                    binds_verl = True
                    out.append(ast.alias(name=renamed, asname=None))
                else:
                    out.append(ast.alias(name=renamed, asname=alias.asname))
            else:
                out.append(alias)
        node.names = out
        if not binds_verl:
            return node
        bind = ast.Assign(
            targets=[ast.Name(id="verl", ctx=ast.Store())], value=ast.Name(id="hybridflow", ctx=ast.Load())
        )
        return [node, ast.copy_location(bind, node)]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        module = node.module or ""
        if node.level == 0 and (module == "verl" or module.startswith("verl.")):
            node.module = "hybridflow" + module[len("verl") :]
        return node


def _verl_installed() -> bool:
    try:
        return importlib.util.find_spec("verl") is not None
    except (ImportError, ValueError):
        return False


class _UserFileLoader(importlib.abc.Loader):
    """Runs a user's file from its source (no bytecode cache), veRL's imports served by hybridflow."""

    def __init__(self, path: str):
        self.path = path

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module) -> None:
        with open(self.path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, filename=self.path)
        renamed = not _verl_installed()
        if renamed:
            tree = ast.fix_missing_locations(_VerlImports().visit(tree))
        try:
            exec(compile(tree, self.path, "exec"), module.__dict__)
        except ImportError as err:
            if renamed and (err.name or "").startswith("hybridflow"):
                err.add_note(
                    f"{self.path} imports from veRL, which is not installed: its verl imports were read as "
                    "hybridflow's, and hybridflow does not serve this one (hybridflow/compat/paths.py: what it serves)"
                )
            raise


def user_file_spec(name: str, path: str):
    """The module spec of the user's Python file ``path`` imported as ``name`` (see the module docstring)."""
    return importlib.util.spec_from_file_location(name, path, loader=_UserFileLoader(path))


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
    spec = user_file_spec(name, path)
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
