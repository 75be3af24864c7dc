"""What a tool declares, as one typed set of keywords, whatever way the tool enters an agent.

`Agent.read` / `Agent.write`, `read_tool` / `write_tool`, a LangChain tool given to either, and an
MCP server's tool (`McpServer.read` / `McpServer.write`) all take these keywords, and each is a
field of `ToolContract` with the same name, type and default: nothing is renamed on the way, and
every contract passes the same checks when it is made (`ToolContract`). Left out, a declaration
takes the safe default: a write asks a person first, is never re-sent unless its downstream
dedupes by key, and cannot be made without its intent key and a way to learn its outcome.

Spell them out to type a wrapper of your own: `def my_write(fn, **options: Unpack[WriteOptions])`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypedDict

from pydantic import BaseModel

from loopwright.core.state import Action, Evidence
from loopwright.tools.contract import (
    ApprovalRule,
    Guarantee,
    Precondition,
    Reconcile,
    ResendAfterDeadline,
    ToolContext,
    ToolDefinitionError,
    Verify,
)


class ToolOptions(TypedDict, total=False):
    """What every tool may declare (a read's and a write's options both hold these).

    `name`, `description`, `args_model`, `output_model`: what the tool is called and what the model
    reads, where the source does not say (a function's name, docstring and annotations; a
    table of tools served by one function). `resources(args)`: what a call touches (checked
    against the task's boundary, used to schedule calls that do not conflict). `authorize(ctx,
    args)`: True or None allows a call for the run's principal, anything else (or raising
    `PermissionDenied`) refuses it. `sensitive`: argument names never shown or traced.
    `timeout_s`: the call's bound where the runtime makes the call (an MCP tool's; a function
    bounds its own requests with `ctx.timeout(seconds)`), within the run's deadline.
    `max_result_bytes`: a larger result is refused, never shown to the model.
    """

    name: str
    description: str
    args_model: type[BaseModel]
    output_model: type[BaseModel]
    resources: Callable[[Any], Iterable[str]]
    authorize: Callable[[ToolContext[Any], Any], bool | None]
    sensitive: Collection[str]
    timeout_s: float
    max_result_bytes: int


class ReadOptions(ToolOptions, total=False):
    """What a read may declare: every tool's options, and how it is retried and polled.

    `max_attempts` (default 2): transport faults are retried in this one layer. `poll_after(result)`:
    seconds until it is worth asking again when a result says "not finished yet" (a poll is not
    mistaken for a loop without progress).
    """

    poll_after: Callable[[dict[str, Any]], float | None] | None
    max_attempts: int


class WriteOptions(ToolOptions, total=False):
    """What a write may declare: every tool's options, and what makes one intent one effect.

    `intent(run_id, args)`: the business intent key, one per business effect (e.g.
    `f"booking:{run_id}:{args.slot}"`), sent on every attempt as the idempotency key, never the
    model's call id; the same key can never carry changed arguments. Required.
    `guarantee` (default `NONE`): what the downstream promises about a write whose answer was
    lost: `IDEMPOTENT_BY_KEY` (an absent intent is re-sent under the same key), `QUERYABLE` (it
    can be looked up, never re-sent blindly) or `NONE` (a person decides).
    `reconcile(ctx, action[, pre_image])`: asks the business system about the intent (required
    unless the guarantee is `NONE`). `verify(ctx, action)`: checks a succeeded write is there
    (default: reconcile says applied; required with a pre-image or without reconcile).
    `needs_approval` (default True): a person decides first: True always, a reason in words
    (always, and the approver is shown why), False never, or a condition `(ctx, args)` answering
    one of them (any answer but False asks).
    `preconditions`: business rules that must hold whatever the model read, checked when the call
    is validated and again right before the send, each raising `PreconditionFailed` (or answering
    False; a rule holds only on None or True).
    `pre_image(ctx, args)`: read and journaled before the send, for a downstream without keys.
    `current_versions(ctx, args)`: refuses a plan made on data that changed since the model read it.
    `resend`: for a downstream without keys, how an intent proven absent is sent again safely.
    `replaces`: the tools (this one's own name included) whose earlier writes this one replaces
    where both touch a resource (a status set again): verification then checks the latest.
    `compensation(action)`: how a succeeded write could be undone, offered to a person on cancel.
    `produces`: output fields that are identifiers the write created (with the pattern that finds
    each in text, else the output model's `Field(pattern=...)`): an answer may cite only those.
    What an approver decides from: `summary(args)`, the action in one line; `facts(args,
    evidence)`, labelled facts drawn from the run's evidence (fixed when the call is planned);
    `editable`, the arguments an approver may change; `confirm(args)` True makes approving a
    two-step decision.
    """

    intent: Callable[[str, Any], str] | None
    guarantee: Guarantee
    reconcile: Reconcile | None
    verify: Verify | None
    needs_approval: ApprovalRule
    preconditions: Precondition | Sequence[Precondition]
    pre_image: Callable[[ToolContext[Any], Any], dict[str, Any]] | None
    current_versions: Callable[[ToolContext[Any], Any], dict[str, str]] | None
    compensation: Callable[[Action], str] | None
    summary: Callable[[Any], str] | None
    produces: Sequence[str] | Mapping[str, str]
    editable: Collection[str]
    facts: Callable[[Any, Sequence[Evidence]], Iterable[tuple[str, str]]] | None
    confirm: Callable[[Any], bool] | None
    resend: ResendAfterDeadline | None
    replaces: Collection[str]


# Every option's name, whatever the effect: one given to a tool of the other effect is refused
# by the contract's own checks, which say why.
OPTION_NAMES = ReadOptions.__optional_keys__ | WriteOptions.__optional_keys__


def known_options(options: Mapping[str, object], tool: str) -> dict[str, Any]:
    """`options` as keywords of `ToolContract`, refusing a name that is no option (a typo would
    otherwise be a TypeError naming no tool)."""
    if unknown := sorted(set(options) - OPTION_NAMES):
        raise ToolDefinitionError(
            f"tool {tool}: {', '.join(unknown)} is no option of a tool (see ReadOptions and"
            " WriteOptions for what may be declared)"
        )
    return dict(options)
