"""No import circles in loopwright: a lower layer never imports a higher one, so that each
module can be read, tested and changed with only what is below it in mind.

Every `import` of a loopwright module counts, those under `if TYPE_CHECKING:` and inside
functions too: a circle hidden from the interpreter is still one for a reader.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import loopwright

PACKAGE = Path(loopwright.__file__).parent


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


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def test_no_module_imports_one_that_imports_it_back() -> None:
    known = modules()
    # A package's __init__ re-exporting its modules is how its public names are made, not a
    # layer: the re-exports are left out, a module importing the package is not.
    graph = {
        name: {target for target in imported(path, known) if target != name}
        for name, path in known.items()
        if path.name != "__init__.py"
    }
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    """The check above can fail: a circle of three is reported from its first module."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
