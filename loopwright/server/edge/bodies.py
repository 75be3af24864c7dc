"""The requests the edge lets through, field by field: one model per request body and query.

Every model forbids what it does not name (`extra="forbid"`): a field the edge has not classified
is refused, whatever the engine behind would make of it. Which of these fields a role may set is
the route's and the run rules' matter (`edge.routes`, `edge.runs`); the values here are bounded
so that nothing a client sends is bigger, or other, than what it needs to be. What reaches the
engine is the model dumped again (`normalised`), never the client's bytes.

Fields the engines take that are refused here, and why, are named in `REFUSED_FIELDS` (their
refusal says why; any other unknown field is refused as not classified).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from loopwright.core.text import unstorable_in
from loopwright.server.inputs import RunRefused, new_run_task

# What a client may have copied into every checkpoint of its run (metadata: LangGraph copies
# its strings and numbers into each checkpoint's metadata): past it, one request would make
# every step of the run store as much again.
MAX_COPIED_BYTES = 1_024
# A run's resume value (a decision: its comment at most 500 characters, at most 20 changes),
# kept whole by the server as a write of the run.
MAX_RESUME_BYTES = 16_384
MAX_PAGE = 1_000

Key = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
Short = Annotated[str, StringConstraints(min_length=1, max_length=128)]


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode())


def refusal(detail: str) -> PydanticCustomError:
    """A validator's refusal, said as `detail` and nothing else."""
    return PydanticCustomError("refused", detail)


def _storable(value: Any) -> Any:
    if (problem := unstorable_in(value, "the value")) is not None:
        raise refusal(problem)
    return value


def _copied_bound(value: dict[str, Any]) -> dict[str, Any]:
    if (size := _json_bytes(value)) > MAX_COPIED_BYTES:
        raise refusal(
            f"metadata goes into every checkpoint of the thread's runs: {size} bytes of it,"
            f" at most {MAX_COPIED_BYTES}"
        )
    return value


# Flat metadata of the client's own naming: primitives under plain keys, text every store
# keeps, bounded as a whole. The owner keys (`server.engine`) are the edge's to write.
Metadata = Annotated[
    dict[Key, str | int | float | bool | None],
    Field(max_length=32),
    AfterValidator(_storable),
    AfterValidator(_copied_bound),
]
# A filter of a search by metadata: the same shape, read only.
MetadataFilter = Annotated[
    dict[Key, str | int | float | bool | None], Field(max_length=16), AfterValidator(_storable)
]


class Closed(BaseModel):
    """A request part that names every field it takes, holding only text every store keeps
    (no NUL character, no half a character: a lone surrogate escape in the JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        return _storable(value)

    def normalised(self) -> dict[str, Any]:
        """What the engine is sent: the fields the client set, as validated here."""
        return self.model_dump(mode="json", exclude_unset=True)


class NoQuery(Closed):
    """A route that takes no query parameters."""


# --- threads ------------------------------------------------------------------------------------


class ThreadCreate(Closed):
    metadata: Metadata | None = None


ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
SortOrder = Literal["asc", "desc"]


class ThreadSearch(Closed):
    ids: Annotated[list[Id], Field(max_length=MAX_PAGE)] | None = None
    metadata: MetadataFilter | None = None
    status: ThreadStatus | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 10
    offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] | None = None
    sort_order: SortOrder | None = None


class ThreadCount(Closed):
    metadata: MetadataFilter | None = None
    status: ThreadStatus | None = None


class CheckpointRef(Closed):
    """A checkpoint of the thread the path names (read only): its id, in the root namespace."""

    checkpoint_id: Id | None = None
    checkpoint_ns: Literal[""] | None = None


class StateAt(Closed):
    checkpoint: CheckpointRef
    subgraphs: bool = False


class HistorySearch(Closed):
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 10
    before: CheckpointRef | None = None
    checkpoint: CheckpointRef | None = None
    metadata: MetadataFilter | None = None


# Query strings: every value arrives as text (pydantic reads "true", "1" as booleans, numbers).
class StateQuery(Closed):
    subgraphs: bool = False


class HistoryQuery(Closed):
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 10
    before: Id | None = None


class ThreadStreamQuery(Closed):
    stream_modes: Short | None = None


# --- runs ---------------------------------------------------------------------------------------

StreamMode = Literal[
    "values",
    "updates",
    "messages",
    "messages-tuple",
    "events",
    "debug",
    "custom",
    "tasks",
    "checkpoints",
]


def _new_task(value: Any) -> Any:
    """A new run's input is `{"task": ...}` and nothing else (`server.inputs`): anything more
    is refused, not dropped (a client whose `principal` was silently ignored learns nothing)."""
    if value is None:
        return None
    try:
        return {"task": new_run_task(value)}
    except RunRefused as exc:
        raise refusal(str(exc)) from None


def _resume_bound(value: Any) -> Any:
    if (size := _json_bytes(value)) > MAX_RESUME_BYTES:
        raise refusal(f"the resume value is {size} bytes: at most {MAX_RESUME_BYTES}")
    return _storable(value)


def _one_at_a_time(value: str) -> str:
    if value in ("interrupt", "rollback"):
        raise refusal(
            f"multitask_strategy {value}: a run in flight stops only by its own user's cancel,"
            " and its record is never rolled back; use reject"
        )
    if value not in ("reject", "enqueue"):
        raise refusal(f"multitask_strategy {value[:40]!r}: use reject")
    return "reject"


def _thread_exists(value: str | None) -> str | None:
    if value not in (None, "reject"):
        raise refusal(
            "a run is a thread: create one first (POST /threads), then start the run on it"
        )
    return value


class Command(Closed):
    """A resume, and nothing else: a client never writes a run's state or routes it."""

    resume: Annotated[Any, AfterValidator(_resume_bound)]


class RunConfig(Closed):
    """A run's config: tags only (the run's thread, checkpoint and configurable values are the
    server's and loopwright's)."""

    tags: Annotated[list[Key], Field(max_length=8)] | None = None


class RunCreate(Closed):
    """A run on a thread: a new task (`input`), a resume (`command`), or nothing (continue)."""

    assistant_id: Short
    input: Annotated[Any, AfterValidator(_new_task)] = None
    command: Command | None = None
    metadata: Metadata | None = None
    config: RunConfig | None = None
    stream_mode: StreamMode | Annotated[list[StreamMode], Field(max_length=9)] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    # A thread runs one run at a time and none waits behind it (`server.admissions`): a run on
    # a busy thread is refused whichever of these a client asks for.
    multitask_strategy: Annotated[str, AfterValidator(_one_at_a_time)] = "reject"
    if_not_exists: Annotated[str | None, AfterValidator(_thread_exists)] = None
    # A client hanging up never cancels a run: a cancel is someone's explicit request.
    on_disconnect: Literal["continue"] = "continue"

    def normalised(self) -> dict[str, Any]:
        """As sent on, with what the edge always decides for the engine written out: one run
        at a time on a thread, and a run that outlives its client's connection."""
        return {
            **super().normalised(),
            "multitask_strategy": self.multitask_strategy,
            "on_disconnect": self.on_disconnect,
        }


class RunsQuery(Closed):
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = 10
    offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    status: Literal["pending", "running", "error", "success", "timeout", "interrupted"] | None = (
        None
    )


class JoinQuery(Closed):
    """A client hanging up on a join never cancels the run."""

    cancel_on_disconnect: Literal[False] = False


class RunStreamQuery(Closed):
    stream_mode: StreamMode | None = None
    cancel_on_disconnect: Literal[False] = False


class CancelQuery(Closed):
    """A cancel asks the run to stop (it settles writes in flight, then ends `cancelled`); a
    rollback, which would erase its record, is refused."""

    wait: bool = False
    action: Literal["interrupt", "cancel"] = "interrupt"


# --- assistants ---------------------------------------------------------------------------------


class AssistantSearch(Closed):
    graph_id: Short | None = None
    name: Short | None = None
    metadata: MetadataFilter | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 10
    offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    sort_by: Literal["assistant_id", "name", "graph_id", "created_at", "updated_at"] | None = None
    sort_order: SortOrder | None = None


class AssistantCount(Closed):
    graph_id: Short | None = None
    name: Short | None = None
    metadata: MetadataFilter | None = None


class VersionsSearch(Closed):
    metadata: MetadataFilter | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 10
    offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0


class GraphQuery(Closed):
    xray: bool | Annotated[int, Field(ge=0, le=10)] = False


class SubgraphsQuery(Closed):
    recurse: bool = False


# --- the server's own ---------------------------------------------------------------------------


class OkQuery(Closed):
    check_db: Literal[0, 1] = 0


class MetricsQuery(Closed):
    format: Literal["prometheus", "json"] | None = None


class DecisionRequest(Closed):
    """An approver's decision through the inbox (`server.app`)."""

    thread_id: Id
    interrupt_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    # The approval the page showed: a decision that comes second is told who decided it.
    approval_id: Id | None = None
    decision: Literal["approve", "reject", "edit"]
    comment: Annotated[str, StringConstraints(max_length=500)] = ""
    changes: Annotated[
        dict[Key, Annotated[str, StringConstraints(max_length=1_000)]], Field(max_length=20)
    ] = Field(default_factory=dict)
    # The approver's second click, for a request that asks for one (`ApprovalRequest.confirm`).
    confirmed: bool = False


# Fields an engine takes that the edge refuses, with why: a client learns what to do instead.
REFUSED_FIELDS: dict[str, str] = {
    "checkpoint": "a run continues from its own latest checkpoint",
    "checkpoint_id": "a run continues from its own latest checkpoint",
    "checkpoint_ns": "a run has one namespace: its own",
    "checkpoint_map": "a run continues from its own latest checkpoint",
    "checkpoint_during": "a run's checkpoints are loopwright's: one at every step",
    "durability": "a run's checkpoints are loopwright's: one at every step",
    "webhook": "the server makes no request to an address a client names",
    "feedback_keys": "the server sends nothing to LangSmith",
    "langsmith_tracer": "the server sends nothing to LangSmith",
    "after_seconds": "a run starts now",
    "interrupt_before": "a run stops only where it asks a person",
    "interrupt_after": "a run stops only where it asks a person",
    "context": "a run's context is the server's: the authenticated user, the agent's tools",
    "configurable": "a run's configurable values are the server's",
    "on_completion": "a run is a thread: create one first (POST /threads)",
    "thread_id": "a thread's id is the server's to choose: create it without thread_id",
    "threadId": "a thread's id is the server's to choose: create it without thread_id",
    "ttl": "nothing deletes or compacts a thread by a timer: a run's record stays",
    "supersteps": "a thread's state is written by its runs only",
    "initial_state": "a thread's state is written by its runs only",
    "if_exists": "a thread's id is the server's to choose",
    "ifExists": "a thread's id is the server's to choose",
    "stream": "streaming is the route's: /runs/stream",
    "strict_resume": "a resume answers the interrupts that wait, as the run reads it",
    "goto": "a client may resume a run, not route it",
    "update": "a client may resume a run, not write its state",
}
