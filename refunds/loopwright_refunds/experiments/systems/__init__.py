"""The three systems under test, behind one small interface.

A system takes a `Job` (one task for one user, with a job id that plays the run id / thread id)
and can be asked to do it (`deliver`) or to carry on after the process doing it died
(`recover`), the way its own deployment would:

* loopwright resumes the run from its checkpoints after the dead process's lease expires;
* the stock prebuilt agent resumes its thread from the last checkpoint (LangGraph's documented
  recovery: invoke with no input), or starts it if nothing was checkpointed;
* the plain loop keeps nothing, so the job is simply delivered again.

Each system reads and writes the same reference services and is driven by the same model; what
differs is only the runtime between the model and the services.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from langchain_core.language_models import BaseChatModel

from loopwright_refunds.services.endpoints import ServiceEndpoints

# Enough for the long task (~30 model calls) with room for retries; the same for every system.
MAX_MODEL_CALLS = 60


@dataclass(frozen=True)
class Deployment:
    """Where every system runs: one Postgres database and one set of reference services."""

    database_url: str
    endpoints: ServiceEndpoints
    lease_ttl_s: float = 1.0


@dataclass(frozen=True)
class Job:
    """One task, delivered to a system. Picklable: child processes receive it."""

    job_id: str
    task: str
    user_id: str
    ledger: Path
    # How the human approver behaves (loopwright only: the baselines ask nobody).
    approval_ttl_s: float | None = None
    approve_after_s: float = 0.0


@dataclass(frozen=True)
class Trace:
    """What a system's own records say about a finished trial, beyond the business truth."""

    # Idempotency keys of writes a human approved before they were sent.
    approved_keys: frozenset[str] = frozenset()
    # Seconds each write spent with its outcome unknown (loopwright's journal; None elsewhere).
    unknown_windows_s: list[float] | None = None
    end: str = ""


class System(Protocol):
    name: str

    def deliver(self, job: Job, model: BaseChatModel) -> None:
        """Do the job from the start, as the first (or a duplicate) delivery of it."""
        ...

    def recover(self, job: Job, model: BaseChatModel) -> None:
        """Carry the job on after the process that worked on it died."""
        ...

    def inspect(self, job: Job) -> Trace: ...


SYSTEMS = ("loopwright", "prebuilt", "plain_loop")


def make_system(name: str, deployment: Deployment) -> System:
    # Imported here: each system pulls in its own stack, and a child process needs only one.
    if name == "loopwright":
        from loopwright_refunds.experiments.systems.loopwright import LoopwrightSystem

        return LoopwrightSystem(deployment)
    if name == "prebuilt":
        from loopwright_refunds.experiments.systems.prebuilt import PrebuiltAgent

        return PrebuiltAgent(deployment)
    if name == "plain_loop":
        from loopwright_refunds.experiments.systems.plain_loop import PlainLoop

        return PlainLoop(deployment)
    raise ValueError(f"unknown system {name!r}; expected one of {', '.join(SYSTEMS)}")
