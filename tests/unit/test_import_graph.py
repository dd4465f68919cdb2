"""No import circle in rollbox, module by module, `if TYPE_CHECKING:` imports counted too: a helper that imports
its owner only for a type annotation still holds it, and calls back into it.

import-linter's `acyclic_siblings` contract (pyproject.toml, run by `lint-imports`) forbids circles between the
packages and modules of each package. A circle that passes through a package's `__init__` (a module importing
its own package, which imports that module) is one only the module graph shows: this test looks there.
"""

from __future__ import annotations

from itertools import pairwise

import grimp


def circles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """One shortest circle through each module that is on one, each told once: (module, ..., module)."""
    found: dict[frozenset[str], tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found.setdefault(frozenset(back), (module, *back))
    return list(found.values())


def described(graph: grimp.ImportGraph, circle: tuple[str, ...]) -> str:
    steps = []
    for importer, imported in pairwise(circle):
        lines = sorted(detail["line_number"] for detail in graph.get_import_details(importer=importer,
                                                                                  imported=imported))
        steps.append(f"  {importer} -> {imported} (line {', '.join(map(str, lines))})")
    return "\n".join(steps)


def test_no_module_of_rollbox_imports_itself_back() -> None:
    graph = grimp.build_graph("rollbox", cache_dir=None)
    found = circles(graph)
    assert not found, f"{len(found)} import circle(s); give the helper what it uses instead of its owner:\n" + \
        "\n".join(described(graph, circle) for circle in found)
