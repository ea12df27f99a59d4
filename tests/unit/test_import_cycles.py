"""Rooms of one job each (issue 23): no import cycle among the modules of app/, tasks/ and
models/, and no such module over MAX_LINES lines; and none of them imports the test tree
(issue 37: the simulator's bug-hunting harness lives in tests/sim, the product keeps only
what `fl-dispatcher simulate` needs).

Every import counts, wherever it is written: at the top, inside a function (a lazy import
still closes a cycle the moment it runs) and under `if TYPE_CHECKING:` (a cycle hidden from
the interpreter is still one for the reader). The checks are parametrized per area (each
package under app/, app's own top-level modules, tasks, models), so a failure names the
area whose modules are at fault: a cycle fails every area one of its modules is in.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "tasks", "models")
MAX_LINES = 500


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool  # an __init__.py: relative imports resolve from the module itself


def _modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            parts = relative.parts
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join(parts)
            found[name] = Module(name, path, is_package)
    return found


MODULES = _modules()


def area_of(module: str) -> str:
    """The area a module belongs to: `app.<package>` for app's packages, `app` for its
    top-level modules, else the top-level package."""
    parts = module.split(".")
    package = MODULES.get(".".join(parts[:2])) if parts[0] == "app" else None
    if package is not None and package.is_package and len(parts) > 1:
        return package.name
    return parts[0]


AREAS = sorted({area_of(name) for name in MODULES})
# Areas whose rooms are known not to meet the rules yet, each with its open issue. Strict:
# the day an area passes, its case fails until it is taken off this list.
OPEN: dict[str, str] = {}


def _areas() -> list[Any]:
    return [
        pytest.param(area, marks=pytest.mark.xfail(strict=True, reason=OPEN[area]))
        if area in OPEN
        else area
        for area in AREAS
    ]


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute name a `from ... import` reads from (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(name: str) -> str | None:
    """The longest prefix of a dotted name that is one of our modules (None: outside)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: Module) -> set[str]:
    """The modules of ours that `module` imports, anywhere in its text."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(filter(None, (_known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                # `from pkg import sub` imports the submodule; `from mod import name` the module.
                target = _known(source if alias.name == "*" else f"{source}.{alias.name}")
                if target is not None:
                    targets.add(target)
    return targets


def strongly_connected(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to hit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                yield sorted(component)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or round about (a module
    importing itself counts as well)."""
    return [
        component
        for component in strongly_connected(graph)
        if len(component) > 1 or component[0] in graph[component[0]]
    ]


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component]
    return f"{', '.join(component)}\n    " + "\n    ".join(edges)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {name: imports_of(module) for name, module in MODULES.items()}


@pytest.mark.parametrize("area", _areas())
def test_no_import_cycle(area: str, graph: dict[str, set[str]]) -> None:
    found = [c for c in cycles(graph) if any(area_of(m) == area for m in c)]
    assert not found, f"import cycles through {area}:\n" + "\n".join(
        _describe(c, graph) for c in found
    )


def _source(path: Path) -> Path:
    """The module as written: under mutation testing (tests/mutation/) the tests run from
    mutmut's copy in mutants/, whose mutated modules are several times longer."""
    if ROOT.name == "mutants":
        return ROOT.parent / path.relative_to(ROOT)
    return path


@pytest.mark.parametrize("area", _areas())
def test_no_module_over_the_line_limit(area: str) -> None:
    sizes = {
        name: len(_source(module.path).read_text().splitlines())
        for name, module in MODULES.items()
        if area_of(name) == area
    }
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules in {area} over {MAX_LINES} lines: " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(over.items())
    )


def foreign_imports(module: Module, package: str) -> set[str]:
    """The modules of `package` (a top-level name, such as tests) that `module` imports,
    anywhere in its text."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(n for n in names if n == package or n.startswith(f"{package}."))
    return found


@pytest.mark.parametrize("area", _areas())
def test_no_product_module_imports_the_tests(area: str) -> None:
    found = {
        name: sorted(foreign_imports(module, "tests"))
        for name, module in MODULES.items()
        if area_of(name) == area and foreign_imports(module, "tests")
    }
    assert not found, f"modules in {area} import the test tree: {found}"


# The checks themselves, on made-up graphs: a broken detector would pass every area above.


def test_tarjan_finds_a_cycle_through_three_modules_and_leaves_a_tree_alone() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_tarjan_counts_a_self_import_and_keeps_two_cycles_apart() -> None:
    graph = {"a": {"a"}, "b": {"c"}, "c": {"b"}, "d": {"b"}}
    assert sorted(cycles(graph)) == [["a"], ["b", "c"]]


def test_imports_in_functions_and_type_checking_blocks_are_edges(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from app.usecases.records import get_job\n"
        "def f():\n"
        "    import tasks.base\n"
        "    from app.usecases import dispatch\n"
        "    from . import names\n"
    )
    module = Module("app.somewhere", source, is_package=False)
    assert imports_of(module) == {
        "app.usecases.records",
        "tasks.base",
        "app.usecases.dispatch",
        "app.names",
    }


def test_an_import_of_the_test_tree_is_found_wherever_it_is_written(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "import testsuite\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tests.sim.invariants import Checker\n"
        "def f():\n"
        "    import tests.fakes\n"
        "    from tests import sim\n"
    )
    module = Module("app.somewhere", source, is_package=False)
    assert foreign_imports(module, "tests") == {"tests.sim.invariants", "tests.fakes", "tests"}
