"""One attempt at advancing one run: the protocol every process that advances a run follows.

    claim -> fence -> watch -> keep the lease -> stream -> record, or count the failure -> release

The runner (the CLI, `loopwright worker`, an embedding program) and the served graph (on either
engine) each open an `attempt` and stream the graph it hands them; nothing else claims a run,
fences its writes or decides what a failed attempt means. So:

* the fence travels with the attempt: its graph is the caller's, copied with a saver fenced to
  this attempt's lease alone (`FencedSaver.fenced`), so one process may advance several runs at
  once, each under its own lease;
* the attempt's clock and cancel flag (`RunWatch`) are kept by the lease's renewals and the
  commits' fence checks, not read by every node;
* an attempt that ends in an error says nothing about the run when its lease was lost or the
  database failed (`NOT_THE_RUNS_FAULT`, or what the caller names); any other error is the run's
  and is counted on it (lw_runs `failures`, with a backoff), and after `MAX_FAILURES` in a row
  the run ends typed, INCOMPLETE `needs_human` with the last error in its detail, whichever
  process or engine made the attempts; an attempt whose process died holding the run counts
  too (its lease lapsed or was reaped before it recorded anything: `LeaseStore.claim`), so a
  run that kills every process advancing it ends typed at a claim, not taken over for ever;
* the lease is given up as the attempt ends, however it ends;
* every attempt is one `run` span (the root of its node, model and tool spans) naming the
  process that made it;
* every checkpoint an attempt commits names its writer in its metadata (`Writer`): the lease's
  owner and fence, what the attempt was given, the process's instance name where a deployment
  gave one, and the agent version that decided it. `loopwright show` reads who did each step
  from there, and where a run changed hands.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from loopwright.checkpoints.database import DATABASE_FAULTS
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.journal import StaleTransition
from loopwright.checkpoints.leases import (
    Lease,
    LeaseHeld,
    LeaseKeeper,
    LeaseLost,
    LeaseStore,
    RunWatch,
    StaleWriter,
)
from loopwright.checkpoints.writers import RESUME, Writer
from loopwright.core.state import Phase, StopReason
from loopwright.core.text import storable
from loopwright.core.views import stop
from loopwright.graph.build import REDERIVABLE_NODES
from loopwright.nodes.context import RunContext
from loopwright.observability.metrics import note_run_end
from loopwright.observability.tracing import instance_name, process_instance, run_span

# What an attempt ends with when another process took the run over while it worked.
OWNERSHIP_LOST = (StaleWriter, StaleTransition, LeaseLost)
# What an attempt may end with that says nothing about the run itself.
NOT_THE_RUNS_FAULT: tuple[type[Exception], ...] = (*OWNERSHIP_LOST, *DATABASE_FAULTS)
MAX_ERROR_CHARS = 1_000
# 8 failures in a row: the last retry comes after 1 + 2 + ... + 64 = 127 s of backoff.
MAX_FAILURES = 8
# How often a claim is tried again while another owner's lease runs out.
CLAIM_POLL_S = 0.2


def worker_name() -> str:
    """Who holds a lease: host, process and a nonce (a restarted process is a new owner)."""
    return f"{process_owner(os.getpid())}{uuid.uuid4().hex[:6]}"


def process_owner(pid: int) -> str:
    """What the owner names of every lease process `pid` of this host holds begin with."""
    return f"{process_instance(pid)}:"


@dataclass(frozen=True)
class Claim:
    """How a process claims a run: as `owner`, for `ttl_s`, for its agent's `version`, waiting
    at most `wait_s` for another owner's lease to end (`on_wait` told once, as it starts)."""

    owner: str
    ttl_s: float
    version: str
    wait_s: float = 0.0
    on_wait: Callable[[LeaseHeld], None] | None = None


def claim(leases: LeaseStore, run_id: str, how: Claim) -> Lease:
    """The run's lease, waiting out another owner's (a crashed process holds its lease until it
    expires) for at most `how.wait_s`; LeaseHeld after that."""
    give_up = time.monotonic() + how.wait_s
    told = False
    while True:
        try:
            return leases.claim(run_id, how.owner, how.ttl_s, agent_version=how.version)
        except LeaseHeld as held:
            if time.monotonic() >= give_up:
                raise
            if not told and how.on_wait is not None:
                how.on_wait(held)
                told = True
            time.sleep(min(CLAIM_POLL_S, max(0.0, give_up - time.monotonic())))


@dataclass
class Turn:
    """An attempt as its maker works it: the lease, the clock and cancel flag the lease keeps,
    the graph fenced to the lease, the attempt's `run` span, and who it is as a writer."""

    leases: LeaseStore
    lease: Lease
    watch: RunWatch
    graph: Pregel[Any, Any, Any, Any]
    span: Span
    keeper: LeaseKeeper
    writer: Writer
    recorded: bool = field(default=False, init=False)

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    def config(self, base: RunnableConfig) -> RunnableConfig:
        """`base` (the config the graph is streamed or updated with) naming this attempt as
        the writer of every checkpoint it commits, over whatever `base`'s metadata says (a
        served run's carries its client's)."""
        metadata = {**(base.get("metadata") or {}), **self.writer.metadata()}
        return {**base, "metadata": metadata}

    def context(self, base: RunContext) -> RunContext:
        """`base` (the run's context) on this attempt's fence, clock and cancel flag."""
        return replace(
            base,
            fence=self.lease.fence,
            clock=self.watch.now,
            cancel_requested=self.watch.cancel_requested,
        )

    def record(
        self, phase: str, next_attempt_at: datetime | None = None, version: str | None = None
    ) -> None:
        """Where the run stands as the attempt lets go of it (its failure streak over), and the
        lease given up with it. `version`: the agent version that wrote the run's last step,
        where that is not this attempt's (it found nothing left to do). Once only: an attempt
        that gave the run up (`give_up`) recorded it so as it did."""
        if self.recorded:
            return
        self.keeper.stop()
        self.leases.record(self.lease, phase, next_attempt_at, release=True, agent_version=version)
        self.recorded = True
        self.span.set_attribute("loopwright.phase", phase)


@contextmanager
def attempt(
    leases: LeaseStore,
    run_id: str,
    *,
    graph: Pregel[Any, Any, Any, Any],
    saver: FencedSaver,
    how: Claim,
    lease: Lease | None = None,
    kind: str = RESUME,
    max_failures: int = MAX_FAILURES,
    not_the_runs: tuple[type[Exception], ...] = (),
) -> Iterator[Turn]:
    """One attempt at run `run_id`, under `lease` (a new run's, taken as it was registered) or
    one claimed now: the block streams `turn.graph` and calls `turn.record`. `kind` says what
    the attempt was given (`advance_kind`); `not_the_runs`: errors of the caller's that say
    nothing about the run either (a client's refused input)."""
    lease = lease or claim(leases, run_id, how)
    watch = RunWatch(lease)
    writer = Writer(how.owner, lease.fence, kind, instance_name(), how.version)
    fenced = graph.copy(
        update={"checkpointer": saver.fenced(Fence.of(lease), watch, rederivable=REDERIVABLE_NODES)}
    )
    attributes: dict[str, AttributeValue] = {
        "loopwright.advance": kind,
        "loopwright.owner": how.owner,
        "loopwright.fence": lease.fence,
    }
    with (
        run_span(run_id, attributes) as span,
        LeaseKeeper(leases, lease, on_renew=watch.renewed) as keeper,
    ):
        turn = Turn(leases, lease, watch, fenced, span, keeper, writer)
        if lease.failures >= max_failures:
            # The streak's last attempts died with their processes: this one ends the run
            # rather than try again what killed them. The block then finds nothing to run.
            give_up(turn, lease.failures, lease.last_error or "")
        try:
            yield turn
        except (*NOT_THE_RUNS_FAULT, *not_the_runs):
            raise  # the new owner carries on, or the database failed us: not the run's fault
        except Exception as exc:
            # An attempt that cannot go on (a bug, a graph that does not end): noted on the
            # run, so that it is tried later and later, and after `max_failures` it ends typed.
            error = storable(f"{type(exc).__name__}: {exc}")[:MAX_ERROR_CHARS]
            if leases.record_failure(lease, error).failures >= max_failures:
                give_up(turn, max_failures, error)
            raise
        finally:
            if not turn.recorded:
                keeper.stop()
                leases.release(lease)


def give_up(turn: Turn, attempts: int, error: str) -> None:
    """End a run whose attempts keep failing (in an error, or with their process):
    INCOMPLETE, needs_human, the last error in its detail. Written as guard's step, whose edge
    then ends the graph; the journal keeps all the run did, and any write it could not confirm
    is reported as such."""
    detail = f"{attempts} attempts in a row did not go through; the last: {error}"
    ended = stop(StopReason.NEEDS_HUMAN, detail)
    config = turn.config({"configurable": {"thread_id": turn.run_id}})
    turn.graph.update_state(config, ended, as_node="guard")
    turn.record(Phase.INCOMPLETE.value)
    note_run_end({}, ended)
