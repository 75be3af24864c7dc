"""Run the fault-injection experiment: loopwright against two baselines, then report.

    python -m loopwright_refunds.experiments -n 3 --out .loopwright/experiment
    python -m loopwright_refunds.experiments -n 1 --scenario partial --fault accept_then_timeout
    python -m loopwright_refunds.experiments -n 1 --scenario keyless_credit   # store credit, no keys
    python -m loopwright_refunds.experiments -n 1 --scenario skips_policy     # refunds without a read

Progress goes to stderr (a bar on a terminal, a line every 10 s otherwise); the report's
summary (its headline, up to the per-fault tables) to stdout, with where results.json, report.md
and the plots were written, or with `--json` one `loopwright.experiment/1` document
(`report.experiment_document`). Bad input (an option that does not parse, an unknown scenario,
fault or system, filters that match no cell, an --out that cannot be written, a Postgres server
that cannot be reached) ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import psycopg

from loopwright.checkpoints.database import DatabaseUnavailable, DatabaseUrlError
from loopwright_refunds.experiments.faults import FaultKind
from loopwright_refunds.experiments.matrix import full_matrix
from loopwright_refunds.experiments.scenarios import SCENARIOS
from loopwright_refunds.experiments.systems import SYSTEMS
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


class _Help(argparse.HelpFormatter):
    """Wraps help between words only: a fault's name cut in two cannot be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        text = " ".join(text.split())
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def _fault(text: str) -> str:
    """A fault kind, or the full name of a fault in the matrix (`crash@executor:after_send`)."""
    if text in set(FaultKind) | {cell.fault.name for cell in full_matrix()}:
        return text
    kinds = ", ".join(FaultKind)
    raise argparse.ArgumentTypeError(
        f"unknown fault {text!r}: a kind ({kinds}) or a full name, crash@POINT (see --help)"
    )


def _listed(values: Sequence[str]) -> str:
    return ", ".join(values).replace("%", "%%")  # argparse formats help strings with %


def parser() -> argparse.ArgumentParser:
    options = _Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=_Help,
    )
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
        "--scenario",
        action="append",
        default=[],
        choices=list(SCENARIOS),
        metavar="SCENARIO",
        help=f"Only these scenarios (repeatable): {_listed(list(SCENARIOS))}.",
    )
    crashes = sorted({c.fault.name for c in full_matrix() if c.fault.kind is FaultKind.CRASH})
    options.add_argument(
        "--fault",
        action="append",
        default=[],
        type=_fault,
        help=(
            f"Only these faults (repeatable), by kind: {_listed(list(FaultKind))}; or by full "
            f"name: {_listed(crashes)}."
        ),
    )
    options.add_argument(
        "--system",
        action="append",
        default=[],
        choices=SYSTEMS,
        metavar="SYSTEM",
        help=f"Only these systems (repeatable): {_listed(SYSTEMS)}.",
    )
    options.add_argument(
        "--json",
        action="store_true",
        help=(
            "Print one JSON document (schema loopwright.experiment/1: the headline per system "
            "and the per-scenario table; see docs/experiments.md) instead of the report's summary."
        ),
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
    try:  # before anything starts: a 12-minute run must not fail at its end on this
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to --out {args.out}: {exc.strerror or exc}") from None
    try:
        results = run_experiment(settings)
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot use the Postgres server: {first}") from None
    if args.json:
        from loopwright_refunds.experiments.report import experiment_document

        print(json.dumps(experiment_document(results, args.out), indent=2))
        return
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
