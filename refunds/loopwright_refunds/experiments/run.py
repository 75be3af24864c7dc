"""Run the experiment: the matrix × N seeded repetitions, telling its progress, then the outputs.

Everything runs on one fresh Postgres database (checkpoints, journal and leases of loopwright,
checkpoints of the prebuilt agent) and one set of reference services on fresh storage, both torn
down at the end. Trials run one at a time: the services' fault switch is global, and timings
taken side by side on two cores would measure each other.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Collection
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from langgraph.checkpoint.postgres import PostgresSaver

from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.journal import open_journal
from loopwright_refunds.experiments.matrix import Cell, full_matrix, select
from loopwright_refunds.experiments.metrics import systems_of
from loopwright_refunds.experiments.progress import Progress
from loopwright_refunds.experiments.scenarios import OrderIds
from loopwright_refunds.experiments.services import start_services
from loopwright_refunds.experiments.systems import Deployment
from loopwright_refunds.experiments.trials import TrialResult, run_trial
from loopwright_refunds.scratch import fresh_database, server_url


@dataclass(frozen=True)
class Settings:
    repetitions: int = 3
    seed: int = 1
    out: Path = Path(".loopwright/experiment")
    database_server: str | None = None
    scenarios: Collection[str] = ()
    faults: Collection[str] = ()
    systems: Collection[str] = ()
    # Cells run in every repetition; default: the full matrix, narrowed by the filters above.
    cells: list[Cell] = field(default_factory=list)

    def matrix(self) -> list[Cell]:
        chosen = self.cells or full_matrix()
        return select(chosen, scenarios=self.scenarios, faults=self.faults, systems=self.systems)


def _prepare(database_url: str) -> None:
    """Create every table once, before processes that would race to create them start."""
    with open_checkpointer(database_url), open_journal(database_url):
        pass
    with PostgresSaver.from_conn_string(database_url) as saver:
        saver.setup()


def run_trials(
    settings: Settings, workdir: Path, on_trial: Callable[[TrialResult], None]
) -> list[TrialResult]:
    cells = settings.matrix()
    results: list[TrialResult] = []
    with ExitStack() as stack:
        url = stack.enter_context(
            fresh_database(server_url(settings.database_server), prefix="lw_exp")
        )
        storage = stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-services-"))
        services = stack.enter_context(start_services(Path(storage)))
        _prepare(url)
        deployment = Deployment(database_url=url, endpoints=services.endpoints)
        ids = OrderIds()
        # Unfaulted run time per (system, scenario), from this repetition's fault-free trials,
        # which come first in the matrix.
        typical: dict[tuple[str, str], float] = {}
        for repetition in range(settings.repetitions):
            for cell in cells:
                key = (cell.system, cell.scenario)
                result = run_trial(
                    cell, repetition, settings.seed, deployment, ids, workdir, typical.get(key)
                )
                if result.fault == "none":
                    typical[key] = result.latency_s
                results.append(result)
                on_trial(result)
    return results


def tally(results: list[TrialResult]) -> str:
    """The progress status: per system, its trials so far whose outcome was not "done" (a
    duplicate, an unauthorized refund, the task not done, an error), then the last trial's
    outcome ("not done: loopwright 0/4, prebuilt 2/4; last: prebuilt partial
    accept_then_timeout: duplicate refund"). A baseline's duplicate is what the experiment
    exists to show, so it is counted as an outcome, never called a failure."""
    if not results:
        return ""
    ran = Counter(r.system for r in results)
    wrong = Counter(r.system for r in results if r.outcome != "done")
    counts = ", ".join(f"{s} {wrong[s]}/{ran[s]}" for s in systems_of(results))
    last = results[-1]
    return f"not done: {counts}; last: {last.system} {last.scenario} {last.fault}: {last.outcome}"


def run_experiment(settings: Settings, stream: TextIO | None = None) -> list[TrialResult]:
    """Run every trial, telling progress on `stream` (default stderr), then write results.json,
    report.md and the plots."""
    from loopwright_refunds.experiments.report import (
        write_outputs,  # matplotlib is imported only to report
    )

    total = len(settings.matrix()) * settings.repetitions
    # Each trial's model bill (ledger) and its child processes' output stay for inspection.
    workdir = settings.out / "trials"
    workdir.mkdir(parents=True, exist_ok=True)
    done: list[TrialResult] = []
    with Progress("trials", total, stream=stream) as progress:

        def advanced(result: TrialResult) -> None:
            done.append(result)
            progress.advance(tally(done))

        results = run_trials(settings, workdir, advanced)
    write_outputs(results, settings.out)
    return results
