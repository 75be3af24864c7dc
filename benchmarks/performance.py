"""Every performance benchmark, one after the other in this one script, with its goal.

    python -m benchmarks.performance [--steps 10] [--rounds 15] [--storage-steps 500]
                                     [--kills 3] [--runs 150] [--db SERVER_URL]

Each benchmark gets a fresh database and fresh reference services (a recovery benchmark's
half-done runs must not feed the throughput benchmark's workers). The figures are printed as
each finishes; where a goal is missed, the benchmark says where the time or bytes go.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks import recovery, step_time, storage, throughput
from benchmarks.perf_setup import bench_environment


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.performance", description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="tool steps per timed run")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timed runs per system")
    parser.add_argument("--storage-steps", type=int, default=500)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--runs", type=int, default=throughput.RUNS, help="runs per worker count")
    parser.add_argument("--db", help="Postgres server URL (fresh databases are made, dropped)")
    args = parser.parse_args(argv)

    print("== tool-step wall time and node commits", flush=True)
    with bench_environment(args.db) as bench:
        figures = step_time.measure(bench, [args.steps], args.rounds, ["postgres", "sqlite"])
    print("\n".join(step_time.report(figures)), flush=True)

    print("\n== checkpoint storage", flush=True)
    with bench_environment(args.db) as bench:
        grown = storage.measure_all(bench, args.storage_steps, ["postgres", "sqlite"])
    print("\n".join(line for figures in grown for line in storage.report(figures)), flush=True)

    print("\n== recovery after kill -9", flush=True)
    with bench_environment(args.db) as bench:
        recoveries = recovery.measure(bench, args.kills)
    print("\n".join(recovery.report(recoveries)), flush=True)

    print("\n== throughput", flush=True)
    with bench_environment(args.db) as bench:
        found = throughput.measure(bench, args.runs)
    print("\n".join(throughput.report(found)), flush=True)


if __name__ == "__main__":
    main()
