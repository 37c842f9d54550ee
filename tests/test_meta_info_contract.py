"""Every ``meta_info`` key hybridflow's code names is declared in hybridflow.protocol_keys (issue 34, point 6).

The scan reads hybridflow/ with ``ast`` and collects string keys from:

- ``X.meta_info[...]``, ``.get/.pop/.setdefault(key)``, ``.update({...}, key=...)``, ``key in X.meta_info``,
  also through a local alias (``meta = batch.meta_info``);
- dict literals that become a meta_info: ``meta_info={...}`` arguments, ``X.meta_info = {...}``, values
  bound to ``meta_info`` or a name or attribute ending in ``_meta``, or returned by a function whose name
  ends in ``_meta``,
  and arguments passed to a parameter named ``meta_info`` of a hybridflow function;
- string constants behind a key's name (``OVER_SAMPLE_ID``), a loop over a tuple of names
  (``for k in OVERRIDABLE``), and calls of helpers that look a parameter up in meta_info (``_meta(data, "x")``).

A key the scan cannot resolve (a computed one) must be listed in ``COMPUTED``, with the reason.
"""

from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from pathlib import Path

from hybridflow.protocol_keys import META_KEYS, declared_meta_key

ROOT = Path(__file__).resolve().parents[1] / "hybridflow"

# (file, function) where a meta_info key is computed; each resolves to declared keys by construction
COMPUTED = {("protocol.py", "*"): "DataProto copies, merges and compares whole meta_info dicts"}


class Scan(ast.NodeVisitor):
    """Collects (key, where) pairs and computed sites of one module."""

    def __init__(self, rel: str, constants: dict, meta_params: dict, lookup_helpers: dict):
        self.rel, self.constants, self.meta_params, self.lookup_helpers = rel, constants, meta_params, lookup_helpers
        self.keys: list[tuple[str, str]] = []
        self.computed: list[tuple[str, str, str]] = []
        self.aliases: list[set[str]] = [set()]
        self.functions: list[str] = ["<module>"]
        self.loops: list[dict[str, tuple]] = [{}]

    # --- helpers
    def where(self, node) -> str:
        return f"{self.rel}:{node.lineno}"

    def is_meta(self, node) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "meta_info":
            return True
        return isinstance(node, ast.Name) and (node.id == "meta_info" or node.id in self.aliases[-1])

    def key(self, node, at) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.keys.append((node.value, self.where(at)))
        elif isinstance(node, ast.Name) and node.id in self.constants:
            self.keys.append((self.constants[node.id], self.where(at)))
        elif isinstance(node, ast.Name) and self.functions[-1] in self.lookup_helpers:
            pass  # a helper's own lookup of its parameter: its callers' keys are collected instead
        elif isinstance(node, ast.Name) and node.id in self.loops[-1]:
            self.keys.extend((k, self.where(at)) for k in self.loops[-1][node.id])
        else:
            self.computed.append((self.rel, self.functions[-1], ast.unparse(node)))

    def dict_keys(self, node, at) -> None:
        """The top-level keys of a dict literal (or of the literals a conditional expression picks)."""
        if isinstance(node, ast.IfExp):
            self.dict_keys(node.body, at), self.dict_keys(node.orelse, at)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self.dict_keys(value, at)
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if k is not None:
                    self.key(k, at)

    # --- scopes
    def visit_FunctionDef(self, node):
        self.functions.append(node.name)
        self.aliases.append(set())
        self.loops.append(dict(self.loops[-1]))
        if node.name.endswith("_meta"):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Dict):
                    self.dict_keys(sub.value, sub)
        self.generic_visit(node)
        self.functions.pop(), self.aliases.pop(), self.loops.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_comprehension_like(self, node):
        saved = dict(self.loops[-1])
        for gen in node.generators:
            if isinstance(gen.target, ast.Name) and isinstance(gen.iter, ast.Name) and gen.iter.id in self.constants:
                value = self.constants[gen.iter.id]
                if isinstance(value, tuple):
                    self.loops[-1][gen.target.id] = value
        self.generic_visit(node)
        self.loops[-1] = saved

    visit_DictComp = visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_comprehension_like

    # --- uses
    def visit_Assign(self, node):
        for target in node.targets:
            if isinstance(target, ast.Name) and self.is_meta(node.value):
                self.aliases[-1].add(target.id)
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "meta_info" or name.endswith("_meta"):
                self.dict_keys(node.value, node)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if self.is_meta(node.value):
            self.key(node.slice, node)
        self.generic_visit(node)

    def visit_Compare(self, node):
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
            self.is_meta(c) for c in node.comparators
        ):
            self.key(node.left, node)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and self.is_meta(func.value):
            if func.attr in ("get", "pop", "setdefault") and node.args:
                self.key(node.args[0], node)
            elif func.attr == "update":
                for arg in node.args:
                    if isinstance(arg, ast.Dict) or isinstance(arg, ast.IfExp):
                        self.dict_keys(arg, node)
                self.keys.extend((kw.arg, self.where(node)) for kw in node.keywords if kw.arg)
        for kw in node.keywords:
            if kw.arg == "meta_info":
                self.dict_keys(kw.value, node)
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in self.meta_params:
            index = self.meta_params[name]
            if index < len(node.args):
                self.dict_keys(node.args[index], node)
        if name in self.lookup_helpers:
            index = self.lookup_helpers[name]
            if index < len(node.args):
                self.key(node.args[index], node)
        self.generic_visit(node)


def _string_constants(trees) -> dict:
    """Module-level ``NAME = "str"`` and ``NAME = ("a", "b")`` of every module (by name)."""
    out = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(value, str) or (isinstance(value, tuple) and all(isinstance(v, str) for v in value)):
                    out[node.targets[0].id] = value
    return out


def _functions(tree):
    """Of one module: (name -> index of its ``meta_info`` parameter) and (name -> index of the parameter
    it looks up in meta_info, for helpers such as ``_meta(data, key)``); ``self`` does not count. Calls
    are matched within the module that defines the function."""
    meta_params, lookup_helpers = {}, {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
        if "meta_info" in params:
            meta_params[node.name] = params.index("meta_info")
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Subscript)
                and isinstance(sub.value, ast.Attribute)
                and sub.value.attr == "meta_info"
                and isinstance(sub.slice, ast.Name)
                and sub.slice.id in params
            ):
                lookup_helpers[node.name] = params.index(sub.slice.id)
    return meta_params, lookup_helpers


def scan(sources: dict[str, str]) -> tuple[dict[str, list[str]], list[tuple[str, str, str]]]:
    """(key -> where it is named, computed sites) over ``sources`` (relative path -> text)."""
    trees = {rel: ast.parse(text) for rel, text in sources.items()}
    constants = _string_constants(trees)
    keys, computed = defaultdict(list), []
    for rel, tree in trees.items():
        visitor = Scan(rel, constants, *_functions(tree))
        visitor.visit(tree)
        for key, where in visitor.keys:
            keys[key].append(where)
        computed.extend(visitor.computed)
    return dict(keys), computed


def _hybridflow_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def _allowed(site: tuple[str, str, str]) -> bool:
    rel, function, _ = site
    return (rel, function) in COMPUTED or (rel, "*") in COMPUTED


def test_every_meta_info_key_in_hybridflow_is_declared():
    keys, computed = scan(_hybridflow_sources())
    undeclared = {k: sites[:3] for k, sites in keys.items() if k not in META_KEYS}
    assert undeclared == {}, f"declare these meta_info keys in hybridflow/protocol_keys.py: {undeclared}"
    assert [s for s in computed if not _allowed(s)] == [], "a computed meta_info key: resolve it or list it"
    # and every declaration is still used (a scan that found nothing would pass the checks above)
    assert sorted(set(META_KEYS) - set(keys)) == [], "a declared meta_info key no code names any more"
    assert all(any(_allowed(s) and s[0] == rel for s in computed) for rel, _ in COMPUTED), "stale COMPUTED entry"


def test_the_scan_fails_on_an_undeclared_key_in_each_form():
    source = textwrap.dedent("""
        KEY = "k_constant"
        NAMES = ("k_loop_a", "k_loop_b")

        def f(batch, data):
            batch.meta_info["k_subscript"] = 1
            meta = batch.meta_info
            meta.get("k_alias_get")
            batch.meta_info.pop(KEY, None)
            batch.meta_info.update({"k_update": 1}, k_kw=2)
            if "k_in" in batch.meta_info:
                pass
            out = {k: batch.meta_info[k] for k in NAMES}
            DataProto(meta_info={"k_keyword": 1})
            self.rollout(batch, {"k_param": 1})
            return _lookup(data, "k_helper")

        def rollout(self, batch, meta_info):
            pass

        def _lookup(data, key):
            return data.meta_info[key]

        def _extra_meta():
            return {"k_returned": 1}
        """)
    keys, computed = scan({"sample.py": source})
    expected = {
        "k_subscript", "k_alias_get", "k_constant", "k_update", "k_kw", "k_in", "k_loop_a", "k_loop_b",
        "k_keyword", "k_param", "k_helper", "k_returned",
    }  # fmt: skip
    assert expected <= set(keys) and not set(keys) & set(META_KEYS)
    assert computed == []


def test_declarations_read_back():
    assert declared_meta_key("temperature").type is float
    assert all(k.writers and k.readers and k.doc for k in META_KEYS.values())
    try:
        declared_meta_key("tempreature")
    except KeyError as e:
        assert "temperature" in str(e)
    else:
        raise AssertionError("an undeclared key must raise")
