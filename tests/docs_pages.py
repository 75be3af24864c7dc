"""The README and the docs pages as the tests read them: headings, sections and code blocks.

A page is named by its path from the repository's root (`README.md`, `docs/serving.md`). Lines
inside a fenced code block are never headings (a shell comment or a Python comment starting
with `#` is text of the block), so a section runs from its heading to the next heading of its
level or above outside any block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.runtime_fixtures import REPO

FENCE = re.compile(r"^```(\S*)\s*$")
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")


@dataclass(frozen=True)
class Heading:
    level: int
    title: str
    line: int  # its index in the page's lines


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # the index of its opening fence


def text(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def parse(page_text: str) -> tuple[list[Heading], list[Block]]:
    """The headings and the fenced code blocks of a page, in order."""
    headings: list[Heading] = []
    blocks: list[Block] = []
    lines = page_text.splitlines()
    opened: tuple[str, int] | None = None
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if opened is not None:
            if fence and not fence[1]:
                language, start = opened
                code = "".join(f"{body}\n" for body in lines[start + 1 : number])
                blocks.append(Block(language, code, start))
                opened = None
        elif fence:
            opened = (fence[1], number)
        elif heading := HEADING.match(line):
            headings.append(Heading(len(heading[1]), heading[2], number))
    assert opened is None, f"a code block opened at line {opened[1] + 1} is never closed"
    return headings, blocks


def headings(page: str) -> list[Heading]:
    return parse(text(page))[0]


def section_lines(page: str, title: str) -> tuple[int, int]:
    """The lines [start, end) of the section headed `title` (exactly one such heading)."""
    found = headings(page)
    [start] = [h for h in found if h.title == title]
    after = [h.line for h in found if h.line > start.line and h.level <= start.level]
    end = after[0] if after else len(text(page).splitlines())
    return start.line, end


def section(page: str, title: str) -> str:
    start, end = section_lines(page, title)
    return "".join(f"{line}\n" for line in text(page).splitlines()[start:end])


def blocks(page: str, language: str, title: str | None = None) -> list[str]:
    """The code of `page`'s blocks in `language`, in order; in section `title` only, if given."""
    start, end = section_lines(page, title) if title else (0, len(text(page).splitlines()))
    return [b.code for b in parse(text(page))[1] if b.language == language and start < b.line < end]


def block_with(page: str, language: str, marker: str) -> str:
    """The one block of `page` in `language` whose code contains `marker`."""
    [block] = [code for code in blocks(page, language) if marker in code]
    return block


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped (but `-` and `_`),
    each space a `-`."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """Every anchor of `page`'s headings, a repeated one suffixed `-1`, `-2`, ... as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(page):
        slug = anchor(heading.title)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found
