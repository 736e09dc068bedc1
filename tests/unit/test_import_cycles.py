"""No import cycle in the package: no module reaches itself through the imports that run, at the top of a module or
inside a function (a lazy import for start-up time is an edge like any other, so it cannot hide a cycle). Imports
under ``if TYPE_CHECKING:`` never run and are left out."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), each sorted."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    imports = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            module, position = work.pop()
            if position == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            targets = imports[module]
            if position < len(targets):
                work.append((module, position + 1))
                target = targets[position]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
    return sorted(cycles)


def test_the_package_has_no_import_cycle() -> None:
    assert import_cycles("topokeeper") == []


def test_a_cycle_held_open_by_an_import_inside_a_function_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "planted_cycle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("from planted_cycle import second, third\n")
    (package / "second.py").write_text("def later():\n    from planted_cycle import first\n")
    (package / "third.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted_cycle import first\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # first <-> second through the lazy import; third -> first under TYPE_CHECKING only closes no cycle.
    assert import_cycles("planted_cycle") == [["planted_cycle.first", "planted_cycle.second"]]
