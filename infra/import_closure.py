"""The files of a package that entry points can import, found by reading the sources (nothing is imported).

Every ``import`` and ``from ... import`` counts wherever it stands, in a function too (the handlers load their
adapters lazily), except under ``if TYPE_CHECKING:`` (never run). A name resolves to the package's module file
(``a/b.py`` or ``a/b/__init__.py``), and every package on the way to it brings its ``__init__.py``. A module
loaded by a computed name (``importlib.import_module(f"...{name}")``) is not seen: it must also be imported by
name where it is used, as topokeeper.wiring.runtime and topokeeper.wiring.login_sync do.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

INIT = "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: true for type checkers only."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, package: str | None) -> str:
    """The module a ``from`` import names, absolute; ``package``: the importing module's package."""
    if node.level == 0:
        return node.module or ""
    if package is None:
        raise ValueError(f"relative import outside a package: line {node.lineno}")
    base = package.split(".")
    if node.level - 1 >= len(base):
        raise ValueError(f"relative import beyond the top-level package: line {node.lineno}")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_names(tree: ast.Module, package: str | None) -> Iterator[str]:
    """Every name an import in ``tree`` may load as a module, absolute (``from a import b``: ``a`` and ``a.b``)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
        pending.extend(ast.iter_child_nodes(node))


def module_file(root: Path, name: str, package: str) -> Path | None:
    """The file of module ``name`` under ``root`` (the directory holding ``package``), or None when ``name`` is
    outside ``package`` or names no module (``from a import function``)."""
    parts = name.split(".")
    if parts[0] != package:
        return None
    for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, INIT)):
        if candidate.is_file():
            return candidate
    return None


def _package_of(root: Path, path: Path) -> str:
    """The package a module file belongs to (for a package's ``__init__.py``, that package)."""
    return ".".join(path.parent.relative_to(root).parts)


def _with_packages(root: Path, path: Path) -> Iterator[Path]:
    """``path`` and the ``__init__.py`` of every package that holds it."""
    yield path
    for depth in range(1, len(path.relative_to(root).parts)):
        init = root.joinpath(*path.relative_to(root).parts[:depth], INIT)
        if init.is_file():
            yield init


def import_closure(entry_points: Iterable[Path], root: Path, package: str) -> list[Path]:
    """The files of ``package`` (under ``root``) that ``entry_points`` (files outside it) import, directly or
    through each other, relative to the package's directory, sorted."""
    found: set[Path] = set()
    pending: list[tuple[Path, str | None]] = [(path, None) for path in entry_points]
    while pending:
        path, module_package = pending.pop()
        for name in imported_names(ast.parse(path.read_bytes(), str(path)), module_package):
            target = module_file(root, name, package)
            for file in _with_packages(root, target) if target is not None else ():
                if file not in found:
                    found.add(file)
                    pending.append((file, _package_of(root, file)))
    return sorted(path.relative_to(root / package) for path in found)
