"""The two distributions this repository builds, as declared: `loopwright` (the runtime) and
`loopwright-refunds` (the reference agent, `refunds/`).

Each wheel holds every package of its own tree and nothing of the other's (a subpackage added
but not listed would be missing from an install, and only from an install); the runtime needs
neither the reference agent nor matplotlib; the reference agent requires the runtime of its
own version. tests/test_outside_app.py builds the runtime's wheel and installs it alone.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

import loopwright
import loopwright_refunds
from tests.runtime_fixtures import REPO

REFUNDS = REPO / "refunds"


def project(folder: Path) -> dict[str, Any]:
    document: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text())
    return document


def packages_under(root: Path, name: str) -> set[str]:
    """Every package (a folder with __init__.py) of `name` at `root`, links followed."""
    top = root / name
    return {
        ".".join((name, *Path(folder).relative_to(top).parts))
        for folder, _, files in os.walk(top, followlinks=True)
        if "__init__.py" in files
    }


def requirements(folder: Path) -> dict[str, Requirement]:
    declared = project(folder)["project"]["dependencies"]
    return {(r := Requirement(line)).name: r for line in declared}


def test_each_wheel_lists_every_package_of_its_own_tree() -> None:
    runtime = set(project(REPO)["tool"]["setuptools"]["packages"])
    refunds = set(project(REFUNDS)["tool"]["setuptools"]["packages"])
    assert runtime == packages_under(REPO, "loopwright")
    assert refunds == packages_under(REFUNDS, "loopwright_refunds")


def test_the_runtime_needs_neither_the_reference_agent_nor_plots() -> None:
    runtime = requirements(REPO)
    assert "matplotlib" not in runtime and "loopwright-refunds" not in runtime
    assert "matplotlib" in requirements(REFUNDS)


def test_the_reference_agent_requires_the_runtime_of_its_own_version() -> None:
    [pin] = requirements(REFUNDS)["loopwright"].specifier
    assert (pin.operator, pin.version) == ("==", loopwright.__version__)
    assert loopwright_refunds.__version__ == loopwright.__version__
