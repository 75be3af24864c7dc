"""Folders are the layers: a module imports only from its own layer and the layers below it, so
that each module can be read, tested and changed with only what is below it in mind.

The layers are written down once, in docs/architecture.md's "Layers" table, bottom first; this
test reads that table and checks every import of every module of the package against it, and
that no modules import each other in a circle (within a layer too). Every `import` of a
loopwright module counts, those under `if TYPE_CHECKING:` and inside functions too: an upward
import hidden from the interpreter is still one for a reader.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import loopwright
from tests.runtime_fixtures import REPO

PACKAGE = Path(loopwright.__file__).parent
ARCHITECTURE = REPO / "docs" / "architecture.md"
# The public API names the public names of every layer (loaded lazily): it is no layer.
PUBLIC_API = "loopwright"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (graph/, nodes/, tools/ and checkpoints/
    are linked into it)."""
    found: dict[str, Path] = {}
    for directory, _, names in os.walk(PACKAGE, followlinks=True):
        for name in names:
            if name.endswith(".py"):
                path = Path(directory) / name
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found[dotted] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The loopwright modules `path` imports (`from pkg import module` names the module)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module in known and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in known else node.module


def import_graph() -> dict[str, set[str]]:
    """Each module (but the public API) and the loopwright modules it imports."""
    known = modules()
    return {
        name: {target for target in imported(path, known) if target != name}
        for name, path in known.items()
        if name != PUBLIC_API
    }


def layer_table(text: str) -> list[list[str]]:
    """The packages of each layer, bottom first, from the "Layers" section's table: a row's
    first cell is the layer's number, its second the packages, each in backticks."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers: list[list[str]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            assert int(cells[0]) == len(layers) + 1, f"layers are numbered from 1 up: {line}"
            layers.append(re.findall(r"`([\w.]+)`", cells[1]))
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int:
    """The layer of the nearest package (or module) the table names that holds `module`."""
    best: tuple[int, int] | None = None  # (length of the package's name, layer)
    for number, packages in enumerate(layers, start=1):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (
                best is None or len(package) > best[0]
            ):
                best = (len(package), number)
    if best is None:
        raise LookupError(f"{module} is in no layer of docs/architecture.md's table")
    return best[1]


def upward(graph: Mapping[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every import of a module from a layer above its own, as `importer (n) -> imported (m)`."""
    found = []
    for module in sorted(graph):
        mine = layer_of(module, layers)
        for target in sorted(graph[module]):
            theirs = layer_of(target, layers)
            if theirs > mine:
                found.append(f"{module} ({mine}) -> {target} ({theirs})")
    return found


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected set of modules, if any (depth-first)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path now, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    layers = layer_table(ARCHITECTURE.read_text())
    assert upward(import_graph(), layers) == []


def test_the_table_names_every_package_once_and_only_packages_that_exist() -> None:
    layers = layer_table(ARCHITECTURE.read_text())
    named = [package for packages in layers for package in packages]
    assert len(named) == len(set(named)), named
    known = modules()
    assert [package for package in named if package not in known] == []
    # Every folder of the package is a layer of its own or inside one the table names.
    for module in known:
        layer_of(module, layers)


def test_every_package_of_the_tree_ships() -> None:
    """A folder moved into a layer of its own is in the wheel: setuptools builds only the
    packages pyproject lists."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    tree = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert {p for p in listed if p.split(".")[0] == PUBLIC_API} == tree


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert circles(import_graph()) == []


def test_an_upward_import_and_a_module_in_no_layer_are_found() -> None:
    """The checks above can fail: an import from a higher layer is reported, a module of a
    package nearer to it counts in that package's layer, and a folder the table does not name
    is an error, not a pass."""
    table = "\n## Layers\n\n| 1 | `p.low` |  |\n| 2 | `p.high`, `p.low.top` |  |\n\n## Next\n"
    layers = layer_table(table)
    assert layers == [["p.low"], ["p.high", "p.low.top"]]
    graph = {"p.low.a": {"p.high.b", "p.low.top"}, "p.high.b": {"p.low.a"}, "p.low.top": set()}
    assert upward(graph, layers) == [
        "p.low.a (1) -> p.high.b (2)",
        "p.low.a (1) -> p.low.top (2)",
    ]
    with pytest.raises(LookupError, match=r"p\.other is in no layer"):
        layer_of("p.other", layers)


def test_a_circle_is_found() -> None:
    """The circle check can fail: a circle of three is reported from its first module."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
