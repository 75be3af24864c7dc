"""The runtime knows no domain: the reference agent's words never appear in its core.

The package (loopwright/core/, graph/, nodes/, tools/, checkpoints/, the runner, the attempt,
the decisions, the CLI and the server) hosts any team's agent; what a refund is, is the reference agent's business
(`loopwright_refunds`). Docstring examples included: they teach the next engineer what the core
is about.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.runtime_fixtures import REPO

# The whole runtime: every module of the package (its top-level folders are subpackages of it),
# but the testing kit, whose scripted model is driven by a `policy` (the word's general sense:
# its public field) and stands in for anyone's model.
PACKAGE = REPO / "loopwright"
NOT_CORE = [PACKAGE / "testing"]
DOMAIN_WORDS = re.compile(r"refund|\border(s|ed|ing)?\b|\bpolic(y|ies)\b|payment", re.IGNORECASE)
# What may name the domain anyway: SQL's ORDER BY, and the import path of the reference agent,
# which the CLI and the server host when none is named (and its distribution's name, which the
# CLI gives where it is not installed).
ALLOWED = re.compile(
    r"\bORDER BY\b|loopwright_refunds\.agent:agent|`loopwright_refunds`|\bloopwright-refunds\b"
    r"|\b(Content-Security|Referrer)-Policy\b"  # HTTP headers' names
)


def core_files() -> list[Path]:
    """Every module and page of the package, through the symlinks that make the design card's
    top-level folders its subpackages."""
    files = sorted(
        path
        for folder, _dirs, names in os.walk(PACKAGE, followlinks=True)
        for path in (Path(folder) / name for name in names)
        if path.suffix in (".py", ".html") and not any(path.is_relative_to(n) for n in NOT_CORE)
    )
    assert any(f.is_relative_to(PACKAGE / "checkpoints") for f in files), "symlinks followed"
    return files


def domain_words(path: Path) -> list[str]:
    return [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DOMAIN_WORDS.search(ALLOWED.sub("", line))
    ]


def test_the_core_names_no_domain() -> None:
    files = core_files()
    assert len(files) > 40  # the folders are where this test thinks they are
    hits = [hit for path in files for hit in domain_words(path)]
    assert hits == [], "\n".join(hits)


def test_the_check_finds_a_domain_word(tmp_path: Path) -> None:
    """A guard that cannot fail guards nothing: a planted word is found, SQL is not."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Refund the order."""\nSQL = "SELECT 1 ORDER BY x"\nin_order = 1\n')
    assert domain_words(sample) == ['sample.py:1: """Refund the order."""']


@pytest.mark.parametrize("folder", ["refunds/loopwright_refunds"])
def test_the_reference_agent_uses_the_public_api_only(folder: str) -> None:
    """The refund agent is a tenant like any other: it imports `loopwright` (the curated
    namespace), never its internals. The exceptions: the experiment's harness, which measures
    the runtime against two baselines, and the child-process helper the launcher of the
    reference services shares with the server's."""
    internal = re.compile(r"^\s*(from|import)\s+loopwright\.(?!processes\b)", re.MULTILINE)
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / folder).rglob("*.py"))
        if "experiments" not in path.parts and internal.search(path.read_text())
    ]
    assert offenders == []
