"""Run the experiment: the matrix × N seeded repetitions, with a progress bar, then the outputs.

Everything runs on one fresh Postgres database (checkpoints, journal and leases of loopwright,
checkpoints of the prebuilt agent) and one set of reference services on fresh storage, both torn
down at the end. Trials run one at a time: the services' fault switch is global, and timings
taken side by side on two cores would measure each other.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from langgraph.checkpoint.postgres import PostgresSaver
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.scratch import fresh_database, server_url
from loopwright_refunds.experiments.matrix import Cell, full_matrix, select
from loopwright_refunds.experiments.scenarios import OrderIds
from loopwright_refunds.experiments.services import start_services
from loopwright_refunds.experiments.systems import Deployment
from loopwright_refunds.experiments.trials import TrialResult, run_trial


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


def run_experiment(settings: Settings, console: Console | None = None) -> list[TrialResult]:
    """Run every trial with a progress bar, then write results.json, report.md and the plots."""
    from loopwright_refunds.experiments.report import (
        write_outputs,  # matplotlib is imported only to report
    )

    console = console or Console(stderr=True)
    total = len(settings.matrix()) * settings.repetitions
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    )
    # Each trial's model bill (ledger) and its child processes' output stay for inspection.
    workdir = settings.out / "trials"
    workdir.mkdir(parents=True, exist_ok=True)
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("trials", total=total, last="")

        def advanced(result: TrialResult) -> None:
            mark = "ok" if result.success else "FAILED"
            last = f"{result.system} {result.scenario} {result.fault}: {mark}"
            progress.update(bar, advance=1, last=last)

        results = run_trials(settings, workdir, advanced)
    write_outputs(results, settings.out)
    return results
