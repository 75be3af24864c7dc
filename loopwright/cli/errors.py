"""How a command fails: a user's mistake in one line on stderr (exit 2), a bug with its
traceback.

A usage error of the command line itself (an unknown option, a missing argument, a number out
of range) is click's, from the copy of click typer really uses (`CLICK_ERRORS`); an error a
user can cause or fix while the command runs (bad input, a run that is not theirs, a system that
is not there or went away) is told by `user_error`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import click

from loopwright.cli.output import console, errors
from loopwright.display import flat


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


class DepsUnavailable(Exception):
    """The agent's dependencies could not be opened (its business systems are not there)."""


def undecodable_argument(args: Sequence[str]) -> str | None:
    """What is wrong with the first argument that is not UTF-8 (Python hands its bytes over as
    unpaired surrogates, which no run, database or service takes), or None. Checked before any
    command runs, so that no command meets it half-way (a run registered, a service asked)."""
    for position, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            given = arg.encode("utf-8", "surrogateescape")
            shown = repr(given) if len(given) <= 60 else f"{given[:57]!r}..."
            return f"argument {position} is not UTF-8 text: {shown}"
    return None


def user_error(exc: Exception) -> str | None:
    """The one line an error a user can cause or fix is reported with (bad input, a run that is
    not theirs, a system that is not there or went away); None for anything else.

    The runtime's exception classes are imported here, once a command has failed, so that a
    command's help needs none of the runtime."""
    import httpx

    from loopwright._agent import TaskRefused
    from loopwright.checkpoints.database import (
        DATABASE_FAULTS,
        DatabaseUnavailable,
        DatabaseUrlError,
    )
    from loopwright.checkpoints.journal import StaleTransition
    from loopwright.checkpoints.leases import LeaseHeld, LeaseLost, RunPruned, StaleWriter
    from loopwright.core.home import HomeUnusable
    from loopwright.core.text import InvalidText
    from loopwright.decisions import DecisionNotTaken, DecisionRefused
    from loopwright.observability.tracing import TraceSettingsError
    from loopwright.runner import ModelChanged, OtherAgentsRun, RunExists, UnknownRun
    from loopwright.server.launch import ServerFailedToStart, ServingRefused

    refused = (
        UsageError,
        DepsUnavailable,
        TaskRefused,
        InvalidText,
        UnknownRun,
        OtherAgentsRun,
        ModelChanged,
        DecisionRefused,
        DecisionNotTaken,
        RunExists,
        LeaseHeld,
        LeaseLost,
        RunPruned,
        StaleWriter,
        StaleTransition,
        DatabaseUrlError,
        DatabaseUnavailable,
        HomeUnusable,
        ServerFailedToStart,
        ServingRefused,
        TraceSettingsError,
    )
    if isinstance(exc, refused):
        return str(exc)
    if isinstance(exc, httpx.TransportError):
        return f"a business service is unreachable: {exc}"
    if isinstance(exc, DATABASE_FAULTS):  # reached, then lost mid-command (a failover)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"the database failed: {first}"
    return None


def _click_errors() -> tuple[type[Exception], ...]:
    """The ClickException classes of the click typer really uses: its own copy (typer._click,
    since typer 0.2x), and the click package, which typer used before and may again."""
    found: list[type[Exception]] = [click.ClickException]
    with contextlib.suppress(ImportError):
        from typer._click.exceptions import ClickException as vendored

        found.append(vendored)
    return tuple(found)


CLICK_ERRORS = _click_errors()


def usage_error(exc: Exception) -> int:
    """Report a usage error in one line, with the command's usage as a hint; its exit code.
    A command given no arguments that needs some prints its help instead."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        console.print(ctx.get_help(), markup=False)
        return 2
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    errors.print(f"loopwright: error: {flat(message)}", markup=False)
    if ctx is not None:
        usage = ctx.get_usage().removeprefix("Usage: ")
        errors.print(f"usage: {usage}  (more: {ctx.command_path} --help)", markup=False)
    return int(getattr(exc, "exit_code", 2))
