"""The options and arguments several commands share, each with its help text (Markdown:
`code` stays literal, a `[table]` is text, not Rich markup)."""

from __future__ import annotations

from typing import Annotated

import typer

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL (sqlite:///FILE or postgresql://...). Default: $DATABASE_URL, else the embedded SQLite file.",
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="openai:MODEL",
        envvar="LOOPWRIGHT_MODEL",
        help="An OpenAI-compatible model instead of the agent's own (a run keeps the model it started with).",
    ),
]
AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help=(
            "The agent to host, as module:attribute. Default: $LOOPWRIGHT_AGENT, else "
            "[tool.loopwright] agent in ./pyproject.toml, else the reference agent."
        ),
    ),
]
TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        metavar="TENANT",
        help="The user's tenant (default: the default one): a principal is a tenant's user, the"
        " same user id in another tenant is someone else.",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document (its schema named in it; listed in docs/cli.md) instead of text.",
    ),
]
RunIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="RUN_ID", help="The run's id, as `run` printed it (`loopwright runs` lists them)."
    ),
]
ApprovalIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="APPROVAL_ID", help="As `loopwright approvals list` shows it (`apr_...`)."
    ),
]
