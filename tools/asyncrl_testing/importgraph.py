"""The third-party modules a console script can import, read from the source (no import is executed).

Called by tests/unit/test_images.py, which checks them against what each role's Dockerfile installs.
Starting at an entry-point module, the walk follows every first-party import in the module's whole
body: top-level, inside functions (the lazy ``import vllm...`` of weightsync/nccl.py, transformers
behind ``importlib.import_module("transformers")``) and in every branch, because any of them can run
in a pod depending on the job's spec (backend, weight sync, teacher). Imports under ``if
TYPE_CHECKING:`` are left out (they never run). What it returns are top-level module names outside the
standard library and the first-party packages, each with the first-party module that imports it.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections.abc import Iterable

FIRST_PARTY = ("asyncrl_api", "asyncrl_operator", "asyncrl_workloads")


def _source(module: str, roots: Iterable[pathlib.Path]) -> pathlib.Path | None:
    parts = module.split(".")
    for root in roots:
        for candidate in (root.joinpath(*parts, "__init__.py"), root.joinpath(*parts).with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """Every dotted module name the body can import: `import a.b`, `from a import b` (a and a.b: b
    may be a submodule), relative imports resolved, `importlib.import_module("literal")`."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            out.append(base)
            out.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append(node.args[0].value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def third_party_imports(entry: str, roots: Iterable[pathlib.Path]) -> dict[str, str]:
    """Top-level third-party module -> the first first-party module found importing it, over the
    import closure of ``entry`` (a dotted first-party module) within the source ``roots``."""
    roots = list(roots)
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, str] = {}
    seen: set[str] = set()
    queue = [entry]
    while queue:
        module = queue.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _source(module, roots)
        if path is None:  # `from pkg import name` where name is not a submodule
            continue
        parents = module.split(".")
        queue.extend(".".join(parents[:i]) for i in range(1, len(parents)))  # packages' __init__ run first
        tree = ast.parse(path.read_text(), str(path))
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                queue.append(name)
            elif top and top not in stdlib and top != "__future__":
                found.setdefault(top, module)
    return found
