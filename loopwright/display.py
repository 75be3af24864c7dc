"""Text of a run, shown to people.

A task, a model's answer, a business system's error, a fact on an approval request: any of them
can be anyone's text (a customer's, a prompt injection's), and a terminal obeys the control
characters in what it prints. An escape sequence recolours, hides or retitles; a carriage return
or a backspace overwrites what came before it; a bidirectional override reorders the rest of the
line; a line break inside a value prints a line of the writer's choosing ("COMPLETED run ...",
"  amount: 5.00" under an approval request for 500.00). So:

- `printable`: every such character spelled out (`\\x1b`, `\\u202e`), line breaks and tabs kept;
- `inline` (rich markup) and `flat` (plain text): a value for a place inside one line of a
  report, its line breaks shown as `⏎`, so that each line of a report is the report's own;
- `SafeConsole`: a console that spells out control characters in all it prints, and prints text
  whose markup does not parse as it is, so that no value can break a report or forge a line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rich.console import Console, JustifyMethod, OverflowMethod
from rich.errors import MarkupError
from rich.markup import escape
from rich.style import Style
from rich.text import Text

__all__ = ["UNSHOWABLE", "SafeConsole", "flat", "inline", "printable"]

# C0 controls but tab and line feed, DEL, C1 controls; the characters that reorder text around
# them (bidirectional marks, embeddings, overrides and isolates); the line and paragraph
# separators, which some terminals and viewers break lines at. (The inbox page spells the same.)
UNSHOWABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
LINE_BREAK_MARK = "⏎"


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on, rather than show, spelled out."""
    return UNSHOWABLE.sub(_spelled, text)


def flat(value: object) -> str:
    """`value` as plain text for a place inside one line: line breaks shown as `⏎`, other
    control characters spelled out."""
    return printable(_LINE_BREAK.sub(LINE_BREAK_MARK, str(value)))


def inline(value: object) -> str:
    """`value` as rich markup for a place inside one line: `flat`, and its brackets escaped."""
    return escape(flat(value))


class SafeConsole(Console):
    """A rich console for text that holds values of runs: whatever is printed has its control
    characters spelled out, emoji codes stay text (":warning:" in a customer's message is not
    an icon), and text whose markup does not parse (a value someone forgot to `inline`) is
    printed as it is rather than raised as an error."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"emoji": False, **kwargs})

    def render_str(
        self,
        text: str,
        *,
        style: str | Style = "",
        justify: JustifyMethod | None = None,
        overflow: OverflowMethod | None = None,
        emoji: bool | None = None,
        markup: bool | None = None,
        highlight: bool | None = None,
        highlighter: Callable[[str | Text], Text] | None = None,
    ) -> Text:
        def render(markup: bool | None) -> Text:
            return super(SafeConsole, self).render_str(
                printable(text),
                style=style,
                justify=justify,
                overflow=overflow,
                emoji=emoji,
                markup=markup,
                highlight=highlight,
                highlighter=highlighter,
            )

        try:
            return render(markup)
        except MarkupError:
            return render(False)
