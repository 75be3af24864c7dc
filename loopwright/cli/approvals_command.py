"""`loopwright approvals list|approve|reject|edit`: what waits for a person, and a person's
decision on it, resumed here or, for a run a server hosts, handed to that server's inbox."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.options import (
    AgentOption,
    ApprovalIdArgument,
    DbOption,
    JsonOption,
    TenantOption,
)
from loopwright.cli.output import console, print_json
from loopwright.display import flat

if TYPE_CHECKING:
    from loopwright._agent import Agent
    from loopwright.core.state import ApprovalChoice
    from loopwright.runner import Runner

TOKEN_ENV = "LOOPWRIGHT_TOKEN"

app = typer.Typer(
    no_args_is_help=True, help="List and decide pending approvals.", rich_markup_mode="markdown"
)

ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="For a run a server hosts: decide through it (its inbox's decision route), as the"
        " approver whose token is in LOOPWRIGHT_TOKEN.",
    ),
]
ApproverOption = Annotated[
    str, typer.Option("--as", metavar="APPROVER", help="The approver's user id.")
]
CommentOption = Annotated[
    str,
    typer.Option(
        "--comment",
        metavar="TEXT",
        help="Why: recorded with the decision, shown in the run's timeline and to its model.",
    ),
]
ReasonOption = Annotated[
    str,
    typer.Option(
        "--comment",
        metavar="TEXT",
        help="Why it is rejected (required): recorded with the decision, shown in the run's"
        " timeline and to its model, which tells the customer.",
    ),
]


def pending_approvals(runner: Runner, tenant: str | None = None) -> list[dict[str, Any]]:
    """The approval requests of the agent's runs (of `tenant`'s users, if given) that have not
    ended (only their states are read: a database's runs are mostly ended ones)."""
    found = []
    for record in runner.leases.unended():
        if record.agent in ("", runner.agent.name) and tenant in (None, record.tenant):
            found += runner.outcome(record.run_id).waiting_for_approval
    return found


def pending_approval(runner: Runner, approval_id: str, tenant: str) -> dict[str, Any] | None:
    """The pending request `approval_id` names, if it is pending in a run of `tenant`'s."""
    pending = pending_approvals(runner, tenant)
    return next((r for r in pending if r["approval_id"] == approval_id), None)


@app.command("list")
def approvals_list(
    db: DbOption = None,
    agent: AgentOption = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="TENANT", help="Only the runs of this tenant's users."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Pending approvals across the agent's runs (every tenant's, unless one is named)."""
    from loopwright.cli import hosting
    from loopwright.reports import approvals_document

    hosted = hosting.agent_for(agent)
    with hosting.records(hosted, db) as runner:
        named = None if tenant is None else hosting.tenant_of(tenant)
        pending = pending_approvals(runner, named) if runner else []
        if as_json:
            print_json(approvals_document(pending, hosted.tools))
            return
        now = runner.leases.now() if runner else None
        for request in pending:
            print_request(request, now, hosted)
        if not pending:
            console.print("no pending approvals")


def print_request(request: dict[str, Any], now: datetime | None, agent: Agent[Any]) -> None:
    """One pending approval as a person decides from it: what, for whom and why, the facts the
    agent declares, until when (on the database's clock, as expiry is judged)."""
    from loopwright.core.state import ApprovalRequest
    from loopwright.timeline import Redactor

    parsed = ApprovalRequest.model_validate(request)
    redactor = Redactor(agent.tools)
    redactor.learn(parsed.tool, parsed.args)
    left = (parsed.expires_at - now).total_seconds() if now and parsed.expires_at else None
    when = f"expires {until(left)}" if left is not None else f"expires {parsed.expires_at}"
    lines = [
        f"{flat(parsed.approval_id)}  run {flat(parsed.run_id)}  {flat(parsed.summary)}",
        f"  for {flat(parsed.requested_by)}: {flat(parsed.task)}" if parsed.task else "",
        f"  why: {flat(parsed.why)}" if parsed.why else "",
        *(f"  {flat(fact.label)}: {flat(fact.value)}" for fact in parsed.facts),
        f"  {when}; digest {parsed.digest[:12]}"
        + ("; approving asks for a confirmation (--yes)" if parsed.confirm else ""),
    ]
    for line in filter(None, lines):
        console.print(redactor.text(line, markup=False), markup=False)


def confirm_approval(request: dict[str, Any]) -> None:
    """The second, deliberate step the write asks for before this approval (as the inbox's
    confirmation): a prompt on a terminal, else --yes; refused, the request still waits."""
    what = f"approving '{request['summary']}' needs a confirmation"
    if not sys.stdin.isatty():
        raise UsageError(f"{what}: add --yes; {request['approval_id']} still waits for a decision")
    if not typer.confirm(f"Really approve '{request['summary']}'?", default=False):
        raise UsageError(f"not confirmed; {request['approval_id']} still waits for a decision")


def until(seconds: float) -> str:
    """`in 23 h`, `in 12 min`, `5 min ago`: how far an expiry is, for a person."""
    minutes = abs(seconds) / 60
    amount = f"{minutes / 60:.0f} h" if minutes >= 90 else f"{max(1, round(minutes))} min"
    return f"in {amount}" if seconds >= 0 else f"{amount} ago"


def decide_command(
    approval_id: str,
    decision: ApprovalChoice,
    approver: str,
    db: str | None,
    agent: str | None,
    comment: str,
    as_json: bool,
    changes: list[str] | None = None,
    *,
    confirmed: bool = False,
    server: str | None = None,
    tenant: str | None = None,
) -> None:
    """An approver of `tenant` decides a request of that tenant's runs (another tenant's are
    not theirs to see: the same answer as for no request at all): `Runner.decide`, or for a run
    a server hosts, that server's inbox, once `decisions.prepare` has taken it (as it will)."""
    from loopwright.cli import hosting
    from loopwright.cli.ending import conclude
    from loopwright.decisions import Asked, prepare

    hosting.checked_person(approver, "--as")
    hosted = hosting.agent_for(agent)
    of_tenant = hosting.tenant_of(tenant)
    missing = f"no pending approval {approval_id!r} of tenant {of_tenant!r}"
    # An approval that is not pending is told from the records alone: no database is created
    # and no business service started for it.
    with hosting.records(hosted, db) as reader:
        if reader is None or pending_approval(reader, approval_id, of_tenant) is None:
            raise UsageError(missing)
    with hosting.session(hosted, db) as runner:
        hosting.require_approver(runner, approver)
        request = pending_approval(runner, approval_id, of_tenant)
        if request is None:  # decided by someone else meanwhile
            raise UsageError(missing)
        if decision == "approve" and request.get("confirm") and not confirmed:
            confirm_approval(request)
        edits = parse_changes(changes or []) if decision == "edit" else None
        run_id = request["run_id"]
        printer = hosting.step_printer(runner, as_json, run_id)
        again = hosting.repeat_options(agent, db)
        record = runner.leases.get(run_id)
        if record is not None and record.engine:
            # Resumed by the engine that hosts it, never behind its back: the engine's own run
            # and thread records then end as the run does. Refused here first, as there.
            asked = Asked(approval_id=approval_id)
            prepare(runner, run_id, approver, decision, asked=asked, comment=comment, changes=edits)
            decided_by_server(server, request, decision, comment, edits)
            outcome = runner.outcome(run_id)
        else:
            with hosting.advancing(run_id, again):
                outcome = runner.decide(
                    run_id,
                    decision,
                    approver,
                    approval_id=approval_id,
                    comment=comment,
                    changes=edits,
                    on_step=printer,
                )
        conclude(runner, outcome, printer, as_json=as_json, again=again)


def decided_by_server(
    server: str | None,
    request: dict[str, Any],
    decision: ApprovalChoice,
    comment: str,
    changes: dict[str, str] | None,
) -> None:
    """Hand a decision about a served run to its server's inbox, as the approver whose token
    is in LOOPWRIGHT_TOKEN, and wait for the run it resumes (the server answers then)."""
    import httpx

    from loopwright.core import tls

    run_id, approval_id = request["run_id"], request["approval_id"]
    if not server:
        raise UsageError(
            f"run {run_id} is served: its server resumes it. Decide in its inbox (/inbox), or"
            f" here with --server URL and {TOKEN_ENV}=<your approver token>"
        )
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise UsageError(f"--server needs your approver token in {TOKEN_ENV}")
    body = {
        "thread_id": run_id,
        "interrupt_id": request["interrupt_id"],
        "decision": decision,
        "comment": comment,
        "changes": changes or {},
        "confirmed": True,  # asked here already, where the write wants it (--yes or a prompt)
    }
    try:
        answer = httpx.post(
            f"{server.rstrip('/')}/inbox/api/decisions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(600.0, connect=10.0),
            verify=tls.context(),
        )
    except httpx.HTTPError as exc:
        raise UsageError(f"--server {server}: {exc}") from None
    if answer.status_code != 200:
        try:
            detail = answer.json().get("detail", answer.text)
        except ValueError:
            detail = answer.text
        raise UsageError(f"the server refused ({answer.status_code}): {detail}; {approval_id}")


def parse_changes(changes: list[str]) -> dict[str, str]:
    """`FIELD=VALUE` pairs (which fields an edit may change, `ApprovalRequest.answer` says)."""
    parsed: dict[str, str] = {}
    for change in changes:
        field, sep, value = change.partition("=")
        if not sep or not field:
            raise UsageError(f"--set {change!r}: expected FIELD=VALUE")
        parsed[field] = value
    return parsed


@app.command("approve")
def approvals_approve(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    db: DbOption = None,
    agent: AgentOption = None,
    comment: CommentOption = "",
    as_json: JsonOption = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes",
            help="Confirm an approval the write asks to be confirmed (its `confirm`, e.g. above"
            " an amount) without a prompt; without a terminal it is required for those.",
        ),
    ] = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Approve one pending action (exactly the digest it names) and resume its run."""
    decide_command(
        approval_id,
        "approve",
        approver,
        db,
        agent,
        comment,
        as_json,
        confirmed=yes,
        server=server,
        tenant=tenant,
    )


@app.command("reject")
def approvals_reject(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    comment: ReasonOption,
    db: DbOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Reject one pending action and resume its run."""
    if not comment.strip():
        raise UsageError("a rejection needs a reason: --comment TEXT")
    decide_command(
        approval_id, "reject", approver, db, agent, comment, as_json, server=server, tenant=tenant
    )


@app.command("edit")
def approvals_edit(
    approval_id: ApprovalIdArgument,
    approver: ApproverOption,
    changes: Annotated[
        list[str],
        typer.Option(
            "--set", metavar="FIELD=VALUE", help="FIELD=VALUE to change; repeat for more fields."
        ),
    ],
    db: DbOption = None,
    agent: AgentOption = None,
    comment: CommentOption = "",
    as_json: JsonOption = False,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Change some arguments of one pending action and resume its run.

    The action asked about is rejected; the edited one waits for an approval of its own.
    """
    decide_command(
        approval_id,
        "edit",
        approver,
        db,
        agent,
        comment,
        as_json,
        changes,
        server=server,
        tenant=tenant,
    )
