"""A worker's poll and the approvals list on a database of many ended runs, with the partial
index of unended runs (`lw_runs_unended`) and, as the baseline in the same database, without it.

    python -m benchmarks.polls [--runs 100000] [--db SERVER_URL]

Both backends: a fresh Postgres database (made and dropped) and a new SQLite file, each holding
`--runs` COMPLETED runs and one that is due. Printed: the median of `POLLS` calls of
`LeaseStore.due` (what every worker asks every poll) and `LeaseStore.unended` (what
`approvals list` and an idle worker read), with the index and with it dropped, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.leases import LeaseStore, open_lease_store
from loopwright.checkpoints.schema import UNENDED_RUNS
from loopwright_refunds.scratch import fresh_database, server_url

POLLS = 30
_ENDED_RUN = (
    "INSERT INTO lw_runs (run_id, owner, fence, phase, task, user_id, created_at, updated_at,"
    " agent, agent_version, failures) VALUES (%s, NULL, 1, 'COMPLETED', 't', 'u', now(), now(),"
    " '', '', 0)"
)


def fill(leases: LeaseStore, runs: int) -> None:
    """`runs` ended runs and one due, the planner's statistics brought up to date."""
    db = leases.db
    leases.register("due-1", task="t", user_id="u")
    with db.transaction():
        for i in range(runs):
            db.execute(_ENDED_RUN, (f"ended-{i}",))
    db.execute("ANALYZE lw_runs" if db.kind is DatabaseKind.POSTGRES else "ANALYZE")


def median_ms(call: Callable[[], object]) -> float:
    timings = []
    for _ in range(POLLS):
        started = time.perf_counter()
        call()
        timings.append(1000 * (time.perf_counter() - started))
    return statistics.median(timings)


def measure(url: str, runs: int) -> list[str]:
    lines = []
    with open_lease_store(url) as leases:
        fill(leases, runs)
        indexed = {"due": median_ms(leases.due), "unended": median_ms(leases.unended)}
        leases.db.execute("DROP INDEX lw_runs_unended")
        scanned = {"due": median_ms(leases.due), "unended": median_ms(leases.unended)}
        leases.db.execute(
            f"CREATE INDEX lw_runs_unended ON lw_runs (updated_at) WHERE {UNENDED_RUNS}"
        )
        assert [r.run_id for r in leases.due()] == ["due-1"]
    for name in indexed:
        lines.append(
            f"{leases.db.kind}, {runs:,} ended runs: {name} {indexed[name]:.2f} ms with the "
            f"index, {scanned[name]:.2f} ms without: {indexed[name] / scanned[name]:.3f}x"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.polls", description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with (
        fresh_database(server_url(args.db), prefix="lw_bench") as pg,
        tempfile.TemporaryDirectory(prefix="lw-polls-") as tmp,
    ):
        for url in (pg, f"sqlite:///{Path(tmp) / 'polls.sqlite3'}"):
            print("\n".join(measure(url, args.runs)), flush=True)


if __name__ == "__main__":
    main()
