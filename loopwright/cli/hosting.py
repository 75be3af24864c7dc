"""What a command hosts: the agent it names, a runner on the database, the run's principal,
and how a command that advances a run prints its steps and stops on Ctrl-C.

Imported by a command's body, never by the command modules themselves: this module brings the
runtime (LangGraph, the database drivers), which a command's help must not wait for.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from loopwright._agent import Agent, TaskRefused
from loopwright._loading import AgentNotFound, load_agent
from loopwright.checkpoints.database import (
    database_exists,
    redact,
    resolve_database_url,
)
from loopwright.checkpoints.leases import LeaseHeld
from loopwright.cli.errors import DepsUnavailable, UsageError
from loopwright.cli.output import console, errors
from loopwright.core.state import DEFAULT_TENANT, Principal
from loopwright.core.text import checked_tenant, validation_problems
from loopwright.display import flat
from loopwright.observability.tracing import TraceSettings
from loopwright.runner import Runner, UnknownRun, lease_ttl_from_env, open_runner
from loopwright.server.service_identity import SERVICE_USER_ID
from loopwright.stopping import stopping_at_once
from loopwright.timeline import TimelinePrinter
from loopwright.tools.contract import ToolDefinitionError

# The agent a command hosts when none is named: the reference agent (the demo's), which is a
# distribution of its own: a runtime installed alone has no default agent.
DEFAULT_AGENT = "loopwright_refunds.agent:agent"
REFERENCE_AGENT_MISSING = (
    f"the reference agent ({DEFAULT_AGENT}, hosted where no agent is named) is not installed:"
    " pip install loopwright-refunds (from a checkout: make demo), or name your agent with"
    " --agent module:attribute"
)
AGENT_ENV = "LOOPWRIGHT_AGENT"


def configured_agent_path(given: str | None) -> str | None:
    """The agent named by --agent, $LOOPWRIGHT_AGENT or ./pyproject.toml, if any."""
    if given:
        return given
    if os.environ.get(AGENT_ENV):
        return os.environ[AGENT_ENV]
    pyproject = Path.cwd() / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        document = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(f"{pyproject}: {exc}") from None
    tool = document.get("tool", {})
    table = tool.get("loopwright", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        what = "tool.loopwright" if isinstance(tool, dict) else "tool"
        raise UsageError(f"{pyproject}: {what} is not a table")
    agent = table.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise UsageError(
            f"{pyproject}: tool.loopwright.agent is {type(agent).__name__}: an import path"
            ' like "mypackage.agents:agent"'
        )
    return agent


def agent_for(given: str | None) -> Agent[Any]:
    """The agent a command hosts (see `configured_agent_path`; default: the reference one)."""
    path = configured_agent_path(given) or DEFAULT_AGENT
    if path == DEFAULT_AGENT and importlib.util.find_spec(DEFAULT_AGENT.split(".")[0]) is None:
        raise UsageError(REFERENCE_AGENT_MISSING)
    try:
        agent = load_agent(path)
        agent.check()
    except (AgentNotFound, ToolDefinitionError) as exc:
        raise UsageError(str(exc)) from None
    return agent


@contextmanager
def session(
    agent: Agent[Any],
    db: str | None,
    model: str | None = None,
    *,
    deps: Callable[[], AbstractContextManager[Any]] | None = None,
    model_change: bool = False,
) -> Iterator[Runner]:
    """A runner of `agent` on the database, with the agent's dependencies open (or `deps`);
    `model_change`: a run it resumes takes this command's model (see `Runner.model_for`)."""
    try:
        if model:
            agent.chat_model(model)  # a bad spec is the user's to fix, before anything opens
        lease_ttl_s = lease_ttl_from_env()
        TraceSettings.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    url = resolve_database_url(db)
    with ExitStack() as stack:
        try:
            opened = stack.enter_context((deps or agent.open_deps)())
        except Exception as exc:
            raise DepsUnavailable(
                f"agent {agent.name}: its dependencies could not be opened: {why(exc)}"
            ) from exc
        # A run whose last process died holds its lease until expiry: wait that long, no longer.
        runner = stack.enter_context(
            open_runner(
                url,
                agent,
                deps=opened,
                model_spec=model or None,
                model_change=model_change,
                lease_wait_s=lease_ttl_s + 1,
            )
        )
        runner.on_lease_wait = say_lease_wait
        yield runner


def say_lease_wait(held: LeaseHeld) -> None:
    """On stderr (stdout may be a --json document): whose lease a command waits out."""
    until = held.expires_at.strftime("%H:%M:%S UTC") if held.expires_at else "its expiry"
    errors.print(
        f"run {flat(held.run_id)} is leased by {flat(held.owner)} until {until}: waiting for it to finish"
        " or its lease to expire (a process that died holds it until then; Ctrl-C stops"
        " waiting)",
        markup=False,
    )


def existing_database(db: str | None) -> str:
    """The URL of the database a command must find there (UsageError where there is none)."""
    url = resolve_database_url(db, create=False)
    if not database_exists(url):
        raise UsageError(f"no loopwright database at {redact(url)}")
    return url


def database_to_read(db: str | None) -> str | None:
    """The URL of the database a command reads, None where there is none yet (the embedded
    file before a first run: reading creates nothing). One named with --db that is not there
    is a mistake (a mistyped path), not an empty database."""
    if db is not None:
        return existing_database(db)
    url = resolve_database_url(None, create=False)
    return url if database_exists(url) else None


@contextmanager
def records(agent: Agent[Any], db: str | None) -> Iterator[Runner | None]:
    """A runner that only reads: the agent's dependencies are not opened, no service starts;
    None where there is no database yet (`database_to_read`)."""
    url = database_to_read(db)
    if url is None:
        yield None
        return
    with open_runner(url, agent, deps=None) as runner:
        yield runner


def tenant_of(given: str | None) -> str:
    """The tenant an option names (checked: one line, exit 2 if it is no tenant's name), or
    the default one."""
    return DEFAULT_TENANT if given is None else checked_tenant(given)


def require_run(agent: Agent[Any], db: str | None, run_id: str) -> None:
    """UnknownRun (or OtherAgentsRun) before a command that advances `run_id` opens anything:
    a run that is not there is told from the records alone, so that no database is created
    and no business service started for it."""
    with records(agent, db) as runner:
        if runner is None:
            raise UnknownRun(run_id)
        runner.owned(run_id)


def why(exc: Exception) -> str:
    """What went wrong, in one line: a validation error's every problem (its first line only
    counts them), else the first line of the message."""
    if isinstance(exc, ValidationError):
        return f"{exc.title}: {validation_problems(exc)}"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def principal_for(runner: Runner, user_id: str, task: str, tenant: str | None = None) -> Principal:
    """The trusted principal of a new run, as the agent derives it from the user and task."""
    try:
        return runner.principal_for(user_id, task, tenant=tenant_of(tenant))
    except TaskRefused as exc:
        raise UsageError(str(exc)) from None


def checked_person(user_id: str, option: str) -> None:
    """Refuse, before anything opens, the user id of the servers' own identity (the one that
    wakes parked runs) named as a person's: no run is started or decided as it."""
    if user_id == SERVICE_USER_ID:
        raise UsageError(
            f"{option} {user_id}: that is the servers' own identity, no person's; name the user"
        )


def require_approver(runner: Runner, approver: str) -> None:
    if not runner.is_approver(approver):
        raise UsageError(f"{approver!r} is not an approver of agent {runner.agent.name}")


def step_printer(runner: Runner, as_json: bool, run_id: str | None = None) -> TimelinePrinter:
    """The timeline as the run advances; with --json, stdout holds the document alone. For a
    run that has steps already (resume, cancel, a decision), numbering goes on from its last
    committed step, as `show` numbers them."""
    printer = TimelinePrinter(Console(quiet=True) if as_json else console, runner.tools)
    if run_id is not None:
        runner.owned(run_id)  # another agent's or an unknown run: its own one-line error
        printer.step = len(runner.steps(run_id))
    return printer


@contextmanager
def advancing(run_id: str, again: str) -> Iterator[None]:
    """Where Ctrl-C (or SIGTERM) stops a run this command advances, at once in any phase
    (`stopping_at_once`): the run keeps every step it committed (a step in flight is run
    again, an action in flight reconciled), its lease is given up, and the user is told how it
    goes on; the command still ends with 130, as an interrupted one does."""

    def tell() -> None:
        errors.print(
            f"loopwright: interrupted: run {run_id} keeps the steps it committed; go on with:"
            f" loopwright resume {run_id}{again}",
            markup=False,
        )

    with stopping_at_once(tell):
        yield


def repeat_options(agent: str | None, db: str | None) -> str:
    """The options a printed follow-up command needs to reach the same agent and database."""
    shown = ""
    if agent:
        shown += f" --agent {agent}"
    if db:
        shown += f" --db {redact(db)}"
    return shown
