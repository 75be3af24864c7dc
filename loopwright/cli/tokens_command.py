"""`loopwright tokens new|hash`: entries of a token table (`LOOPWRIGHT_TOKENS_FILE`), which
stores tokens hashed."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import AgentOption
from loopwright.cli.output import console

# What `tokens hash` reads at most: far more than any token a server takes.
MAX_INPUT_CHARS = 65_536

app = typer.Typer(
    no_args_is_help=True,
    help="Entries of a token table (`LOOPWRIGHT_TOKENS_FILE`): tokens stored hashed.",
    rich_markup_mode="markdown",
)


@app.command("new")
def tokens_new(
    user: Annotated[str, typer.Option("--user", metavar="USER_ID", help="Whom the token names.")],
    role: Annotated[
        list[str],
        typer.Option(
            "--role",
            metavar="ROLE",
            help="A role name the agent grants something by (its roles=: who starts runs,"
            " decides approvals, reads the metrics); repeatable.",
        ),
    ],
    tenant: Annotated[str, typer.Option("--tenant", help="The user's tenant.")] = "default",
    agent: AgentOption = None,
) -> None:
    """A new random token and its table entry: the token on the first line (hand it to its
    user; it is stored nowhere), the entry (its hash) as JSON on the second, to add to the
    table's object. A role the agent grants nothing by is refused: the token would be refused
    everywhere it was used."""
    from loopwright.cli import hosting
    from loopwright.server.bearer_tokens import hash_token, new_token
    from loopwright.server.users import user_of

    hosting.checked_person(user, "--user")
    try:
        named = user_of({"user_id": user, "roles": role, "tenant": tenant})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    hosted = hosting.agent_for(agent)
    if idle := [name for name in named.roles if not hosted.roles.granting(name)]:
        raise UsageError(
            f"role {', '.join(map(repr, idle))} grants nothing with agent {hosted.name},"
            f" whose roles are {hosted.roles} (--agent names another agent)"
        )
    token = new_token()
    entry = {"user_id": named.user_id, "roles": list(named.roles), "tenant": named.tenant}
    console.print(token, markup=False)
    console.print(json.dumps({hash_token(token): entry}), markup=False)


@app.command("hash")
def tokens_hash(
    token: Annotated[
        str | None,
        typer.Argument(help="The token; default: read from standard input (out of the history)."),
    ] = None,
) -> None:
    """The table key of a token you have: `sha256:<hex>`. One token at a time: standard input
    holding more than one line is refused, not hashed in part."""
    from loopwright.server.bearer_tokens import MIN_TOKEN_CHARS, hash_token

    text = token if token is not None else sys.stdin.read(MAX_INPUT_CHARS + 1)
    if len(text) > MAX_INPUT_CHARS:
        raise UsageError(f"a token is at most {MAX_INPUT_CHARS} characters")
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        raise UsageError(
            f"one token at a time: {len(lines)} lines were given (hash each with its own"
            " `loopwright tokens hash`)"
        )
    given = text.strip()
    if not given or any(character.isspace() for character in given):
        raise UsageError("a token is one word, not blank")
    if len(given) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"a token of {len(given)} characters is guessable from its hash: take one of at"
            f" least {MIN_TOKEN_CHARS} (loopwright tokens new makes one)"
        )
    console.print(hash_token(given), markup=False)
