"""The README and the docs pages hold together: every relative link points at a file (and a
heading) that exists, every repository path they name exists, and every Python example they
show is one a test runs.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest

from tests import docs_pages
from tests.runtime_fixtures import REPO

PAGES = sorted(
    str(path.relative_to(REPO))
    for path in [REPO / "README.md", REPO / "refunds" / "README.md", *REPO.glob("docs/*.md")]
    if path.exists()
)
# A markdown link outside code: [text](target); an inline code span is no link.
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
# A repository path named in code, a file's or a folder's: `graph/crashpoints.py`,
# `loopwright/server/edge/` (not a name like `loopwright/intent_key`).
PATH = re.compile(r"`([A-Za-z_][\w.-]*(?:/[\w.*-]+)*(?:/[\w*-]+\.\w+|/))`")
# The Python examples, by page and section, and the test that runs each section's as written
# (which names both). The API reference's blocks are signatures, generated from the code.
EXECUTED = {
    ("README.md", "Your first agent"): "tests/test_public_api.py",
    ("docs/faults.md", "In an application's own tests: `prove`"): "tests/test_public_api.py",
    ("docs/identities.md", "Roles: who may do what"): "tests/test_public_api.py",
    ("docs/declarations.md", "Tools of an MCP server"): "tests/test_mcp_tools.py",
    ("docs/serving.md", "Start the server (offline)"): "tests/test_readme_walkthrough.py",
    ("docs/programs.md", "An example"): "tests/test_programs_docs.py",
}
NOT_EXAMPLES = {"docs/api.md"}


def prose(page: str) -> str:
    """The page without its code blocks and code spans: where links are links."""
    lines = docs_pages.text(page).splitlines()
    for block in docs_pages.parse(docs_pages.text(page))[1]:
        end = block.line + len(block.code.splitlines()) + 2
        lines[block.line : end] = [""] * (end - block.line)
    return CODE_SPAN.sub("", "\n".join(lines))


def relative_links(page: str) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto: ...
    ]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: str) -> None:
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (REPO / page).parent / path if path else REPO / page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment:
            named = str(linked.resolve().relative_to(REPO))
            if not named.endswith(".md") or fragment not in docs_pages.anchors(named):
                broken.append(f"{target}: no heading with that anchor in {named}")
    assert not broken, broken


def test_the_readme_links_every_docs_page() -> None:
    """A newcomer finds every page from the README."""
    linked = {
        str(PurePosixPath(t.partition("#")[0])) for t in relative_links("README.md") if "docs/" in t
    }
    pages = {p for p in PAGES if p.startswith("docs/")}
    assert pages <= linked, pages - linked


@pytest.mark.parametrize("page", PAGES)
def test_every_repository_path_a_page_names_exists(page: str) -> None:
    """A path whose first folder is the repository's (not a generated one like `.loopwright/`)
    names something there: a moved or renamed module is a stale page."""
    tops = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}
    named = [p for p in PATH.findall(docs_pages.text(page)) if p.split("/")[0] in tops]
    missing = [p for p in named if not any(REPO.glob(p.rstrip("/")))]
    assert not missing, missing


def test_every_python_example_is_one_a_test_runs() -> None:
    for page in PAGES:
        if page in NOT_EXAMPLES:
            continue
        sections = [title for (named, title) in EXECUTED if named == page]
        ranges = [docs_pages.section_lines(page, title) for title in sections]
        for block in docs_pages.parse(docs_pages.text(page))[1]:
            if block.language == "python":
                where = f"{page}, line {block.line + 1}"
                assert any(start < block.line < end for start, end in ranges), where
    for (page, title), test in EXECUTED.items():
        assert docs_pages.blocks(page, "python", title), (page, title)
        source = (REPO / test).read_text()
        assert page in source and title in source, f"{test} runs {page}, {title!r}"
