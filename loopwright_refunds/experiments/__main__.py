"""Run the fault-injection experiment: loopwright against two baselines, then report.

    python -m loopwright_refunds.experiments -n 3 --out .loopwright/experiment
    python -m loopwright_refunds.experiments -n 1 --scenario partial --fault accept_then_timeout
    python -m loopwright_refunds.experiments -n 1 --scenario keyless_credit   # store credit, no keys
    python -m loopwright_refunds.experiments -n 1 --scenario skips_policy     # refunds without a read

Progress goes to stderr; the report's summary (its headline, up to the per-fault tables) to
stdout, with where results.json, report.md and the plots were written. Bad input (an option
that does not parse, filters that match no cell, a Postgres server that cannot be reached)
ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import psycopg
from rich.console import Console

from loopwright.checkpoints.database import DatabaseUnavailable, DatabaseUrlError
from loopwright_refunds.services.launcher import ServicesFailedToStart

PROG = "python -m loopwright_refunds.experiments"
DEFAULT_OUT = Path(".loopwright/experiment")


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def parser() -> argparse.ArgumentParser:
    options = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    options.add_argument(
        "-n",
        "--repetitions",
        type=_positive,
        default=3,
        help="Seeded repetitions of the matrix (default 3).",
    )
    options.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"Where results.json, report.md and the plots go (default {DEFAULT_OUT}).",
    )
    options.add_argument(
        "--seed", type=int, default=1, help="Seeds amounts and fault timings (default 1)."
    )
    options.add_argument(
        "--db",
        help=(
            "Postgres server to create the experiment's database on (dropped after). Default: "
            "$DATABASE_URL, else postgresql://postgres@127.0.0.1:5432/postgres."
        ),
    )
    options.add_argument(
        "--scenario", action="append", default=[], help="Only these scenarios (repeatable)."
    )
    options.add_argument(
        "--fault",
        action="append",
        default=[],
        help="Only these faults, by kind or full name (repeatable).",
    )
    options.add_argument(
        "--system", action="append", default=[], help="Only these systems (repeatable)."
    )
    return options


def experiment(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    # Imported after the options parse: the experiment pulls in LangGraph and every system.
    from loopwright_refunds.experiments.run import Settings, run_experiment

    settings = Settings(
        repetitions=args.repetitions,
        seed=args.seed,
        out=args.out,
        database_server=args.db,
        scenarios=tuple(args.scenario),
        faults=tuple(args.fault),
        systems=tuple(args.system),
    )
    if not settings.matrix():
        raise UsageError("no cell of the matrix matches --scenario, --fault and --system")
    try:
        run_experiment(settings, console=Console(stderr=True, highlight=False, soft_wrap=True))
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot use the Postgres server: {first}") from None
    print((args.out / "report.md").read_text().split("\n## By fault")[0])
    print(f"wrote {args.out}/results.json, report.md and the plots")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        experiment(argv)
    except (UsageError, DatabaseUrlError, DatabaseUnavailable, ServicesFailedToStart) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
