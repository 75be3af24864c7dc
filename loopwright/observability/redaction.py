"""What of a tool call's arguments may leave the database: digests, and redacted copies.

Fields a tool contract marks sensitive (`ToolContract.sensitive`, e.g. a card number) are
replaced by "[redacted]" wherever they appear, at any depth, in every copy made for people or
for a trace backend. The digest exported in traces is taken over that redacted copy, not over
the raw arguments: a card number has so few possible values that a digest of it could be
reversed by trying them all. (The journal's own `args_digest`, over the raw arguments, stays in
the database.)
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from loopwright.core.state import digest

REDACTED = "[redacted]"


def redact(value: Any, sensitive: Collection[str]) -> Any:
    """`value` with the value of every key named in `sensitive` replaced, at any depth."""
    if not sensitive:
        return value
    if isinstance(value, dict):
        return {k: REDACTED if k in sensitive else redact(v, sensitive) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, sensitive) for v in value]
    return value


def redacted_digest(args: Any, sensitive: Collection[str]) -> str:
    """The digest of the redacted arguments; equal to the raw digest when nothing is sensitive."""
    return digest(redact(args, sensitive))
