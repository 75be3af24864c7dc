"""Text a caller hands the runtime (a task, a user's or a run's id), checked before anything is
asked of the agent or written: refused in one line if a run could not keep it as given.

Postgres stores no NUL character in a text column or a JSONB value, and no store takes an
unpaired surrogate, which is not UTF-8 at all (it is what Python makes of the bytes of a command
line that are not UTF-8). Such text would otherwise fail a run half-way in, at its first
write, with a database's error; the same text is refused on every backend, so a run does not
depend on where it is kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import ValidationError

# A task is an instruction, not a document: the model sees it at every step.
MAX_TASK_CHARS = 2_000
# A run's id is a name people type, paste into commands and URLs and read in lists: letters,
# digits and `._:-`, beginning with a letter or a digit (not with `-`, which a command line
# takes for an option). The runtime's own ids (`run-` and 12 hex digits) and the server's
# (UUIDs) are such names.
MAX_RUN_ID_CHARS = 128
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_NOT_IN_RUN_ID = re.compile(r"[^A-Za-z0-9._:-]")
# A tenant's name, as a token table or an operator's --tenant gives it.
TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")


class InvalidText(ValueError):
    """Text a run cannot take as given (a blank or over-long task; a NUL character or half a
    character in a task, a user's or a run's id), refused before anything is written. Entry
    points report it in one line: exit 2, or a 4xx."""


def checked_text(what: str, value: object, *, max_chars: int | None = None) -> str:
    """`value` if it is text a run can keep, non-blank and at most `max_chars` long; else
    InvalidText naming `what` and the first character at fault."""
    if not isinstance(value, str):
        raise InvalidText(f"{what} must be text, not {type(value).__name__}")
    if not value.strip():
        raise InvalidText(f"{what} is empty")
    if max_chars is not None and len(value) > max_chars:
        raise InvalidText(f"{what} is {len(value)} characters long: at most {max_chars}")
    if (problem := unstorable(value)) is not None:
        raise InvalidText(f"{what} {problem}")
    return value


def named_run(run_id: str) -> str:
    """A run id as a message names it: as it is where it is a run id's name, quoted where it
    could not be told from the words around it (empty, spaced, odd)."""
    return run_id if _RUN_ID.fullmatch(run_id) else repr(run_id)


def checked_run_id(value: object) -> str:
    """`value` if it is text a run can keep (`checked_text`) and a run id's name, at most
    `MAX_RUN_ID_CHARS` long; else InvalidText saying what is wrong with it."""
    run_id = checked_text("the run id", value, max_chars=MAX_RUN_ID_CHARS)
    if _RUN_ID.fullmatch(run_id):
        return run_id
    odd = _NOT_IN_RUN_ID.search(run_id)
    fault = f"holds {odd.group()!r} (at {odd.start()})" if odd else f"begins with {run_id[0]!r}"
    raise InvalidText(
        f"the run id {fault}: a run id is letters, digits and . _ : -, beginning with a letter"
        " or a digit"
    )


def checked_tenant(value: str) -> str:
    """`value` if it is a tenant's name (letters, digits and . _ -, at most 64); else
    InvalidText saying so."""
    if TENANT.fullmatch(value):
        return value
    raise InvalidText(
        f"the tenant {value!r} is not a tenant's name: letters, digits and . _ -, at most 64"
    )


def unstorable(text: str) -> str | None:
    """Why no store keeps `text` as given ("holds ...", "is not ..."), or None if one can."""
    if (nul := text.find("\x00")) >= 0:
        return f"holds a NUL character (at {nul}), which no run can store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"is not UTF-8 text: {text[exc.start]!r} at {exc.start} is half a character"
            " (bytes that are not UTF-8, on a command line)"
        )
    return None


def unstorable_in(value: object, path: str = "the request") -> str | None:
    """The first text in a JSON-like `value` (keys included) that no store keeps, named by its
    path, and why; or None."""
    if isinstance(value, str):
        problem = unstorable(value)
        return None if problem is None else f"{path} {problem}"
    if isinstance(value, Mapping):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = unstorable_in(key, f"a key of {path}") or unstorable_in(item, f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def storable(text: str) -> str:
    """`text` as every store keeps it, for text of the runtime's own making that quotes someone
    else's (an error's line): a NUL character written `\\x00`, half a character as its escape
    (`\\udcff`). The odd character is spelled out rather than the whole line lost."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def validation_problems(exc: ValidationError) -> str:
    """What pydantic found wrong, in one line (`field: problem; ...`): without its documentation
    links or the input itself, which may be long, or what a caller should not see again."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'the value'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )
