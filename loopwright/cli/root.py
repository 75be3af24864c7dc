"""The loopwright command: host an agent's runs (run, resume, cancel, approvals, worker,
serve), read them back (show, runs), and the demo.

Every command hosts one agent, named by import path (`--agent module:attribute`,
`$LOOPWRIGHT_AGENT`, or `agent = "..."` in a `[tool.loopwright]` table of ./pyproject.toml);
the reference agent (`loopwright_refunds`) is the default. Errors a user can cause (a bad
database URL, a user or task the agent refuses, an unknown run, another agent's run) end with
one line on stderr and exit code 2, never a traceback. The exit code of a command that advances
a run says where it stands: 0 completed, 3 waiting for a person, 4 incomplete, 5 parked.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import click
import typer
from typer.core import TyperOption

from loopwright.cli import (
    approvals_command,
    faults_command,
    graph_command,
    runs_commands,
    serve_command,
    tokens_command,
    worker_command,
)
from loopwright.cli.errors import CLICK_ERRORS, undecodable_argument, usage_error, user_error
from loopwright.cli.output import console, errors
from loopwright.display import flat

# Help texts are Markdown: `code` stays literal, and a `[table]` is text, not Rich markup.
app = typer.Typer(
    no_args_is_help=True,
    help=__doc__,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
# Help lists the commands as they are added here; a group's own commands under its name.
for commands in (runs_commands, faults_command, worker_command, graph_command, serve_command):
    app.add_typer(commands.app)
app.add_typer(approvals_command.app, name="approvals")
app.add_typer(tokens_command.app, name="tokens")


def _print_version(value: bool) -> None:
    if value:
        from loopwright import __version__

        console.print(f"loopwright {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """loopwright: a recoverable agent runtime on LangGraph."""


def main() -> None:
    command = typer.main.get_command(app)
    plain_help(command)
    if (problem := undecodable_argument(sys.argv[1:])) is not None:
        errors.print(f"loopwright: error: {problem}", markup=False)
        raise SystemExit(2)
    try:
        code = command.main(prog_name="loopwright", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(130) from None
    except CLICK_ERRORS as exc:
        raise SystemExit(usage_error(exc)) from None
    except Exception as exc:
        message = user_error(exc)
        if message is None:
            raise  # a bug: its traceback is what a report needs
        errors.print(f"loopwright: error: {flat(message)}", markup=False)
        raise SystemExit(2) from None
    # A command's own exit code (typer.Exit): how the run it advanced stands (EXIT_CODES).
    raise SystemExit(code if isinstance(code, int) else 0)


def plain_help(command: Any) -> None:
    """Help that shows what to type: a flag shows no value type (typer prints `<bool>` after
    --json, --help, --install-completion), an option without its own metavar shows its name
    (RUN_ID, not `<str>`). For `command` and every command under it."""
    help_option = command.get_help_option(command.context_class(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if param.metavar is None and isinstance(param, click.Option | TyperOption):
            param.metavar = "" if param.is_flag else (param.name or "").upper()
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)
