"""Rules of the library's source, read from the AST (so they hold for code no test runs):

- ``print(`` only in the ``main()`` of a command-line entry point (a module with an
  ``if __name__ == "__main__":`` block) and the few places listed below; the library logs through
  ``logging`` under the ``hybridflow`` logger;
- the library never configures logging itself (no ``basicConfig``; handlers only in
  ``utils/logging_utils.py``, which entry points call);
- the generic helpers that once had copies are defined once.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "hybridflow"

# (module, enclosing function) -> why printing is the product there
PRINT_ALLOWED = {
    ("utils/tracking.py", "_Console.log"): "trainer.logger=console: one line per step on stdout",
    ("config/loader.py", "parse_cli"): "the entry points' shared command line: --help, --cfg job, usage errors",
    ("data/preprocess/local_io.py", "preprocess_main"): "the main() every preprocessing script runs",
}
DEFINED_ONCE = {
    "resolve_dtype": "utils/torch_dtypes.py",
    "strip_wrapper_prefixes": "utils/param_names.py",
    "leaf_items": "utils/nested_dict.py",
}


def _modules():
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        yield path.relative_to(PACKAGE_ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def calls(tree: ast.AST, name: str) -> list[tuple[int, list[str]]]:
    """(line, enclosing class/function names from the outside in) of every call of ``name`` (a bare
    name like ``print`` or an attribute like ``basicConfig``)."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = (
                    func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                )
                if called == name:
                    found.append((child.lineno, scope))
            visit(child, scope)

    visit(tree, [])
    return found


def print_violations(modules) -> list[str]:
    bad = []
    for rel, tree in modules:
        entry_point = any(_is_main_guard(node) for node in tree.body)
        for line, scope in calls(tree, "print"):
            where = ".".join(scope) or "<module>"
            if entry_point and scope and scope[0] == "main":
                continue
            if (rel, where) not in PRINT_ALLOWED:
                bad.append(f"hybridflow/{rel}:{line} print() in {where}")
    return bad


def test_the_checker_finds_prints_outside_entry_point_mains():
    library = ast.parse("def f():\n    print('x')\nclass C:\n    def main(self):\n        print('y')\n")
    entry = ast.parse(
        "def main():\n    print('ok')\n    def inner():\n        print('ok too')\n"
        "def helper():\n    print('no')\nif __name__ == '__main__':\n    main()\n"
    )
    not_entry = ast.parse("def main():\n    print('no guard')\n")
    found = print_violations([("lib.py", library), ("cli.py", entry), ("x.py", not_entry)])
    assert found == [
        "hybridflow/lib.py:2 print() in f",
        "hybridflow/lib.py:5 print() in C.main",
        "hybridflow/cli.py:6 print() in helper",
        "hybridflow/x.py:2 print() in main",
    ]


def test_print_only_in_entry_point_mains():
    assert not print_violations(_modules()), "log through logging.getLogger(__name__) instead"


def test_the_library_does_not_configure_logging():
    bad = []
    for rel, tree in _modules():
        for name in ("basicConfig", "addHandler", "dictConfig", "fileConfig"):
            if rel != "utils/logging_utils.py":
                bad += [f"hybridflow/{rel}:{line} {name}()" for line, _ in calls(tree, name)]
    assert not bad, "entry points call hybridflow.utils.logging_utils.setup_cli_logging() in main()"


def test_generic_helpers_are_defined_once():
    defined: dict[str, list[str]] = {name: [] for name in DEFINED_ONCE}
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in defined:
                defined[node.name].append(rel)
    assert defined == {name: [rel] for name, rel in DEFINED_ONCE.items()}
