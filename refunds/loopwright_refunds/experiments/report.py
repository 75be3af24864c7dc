"""The experiment's outputs: results.json, report.md and the PNG plots, in one directory.

The Markdown report leads with the headline table (one row per system over every trial), then
the duplicate and unauthorized figures side by side for every slice (by scenario with the
policy-violating refunds too), the crash points one by one,
the keyless store-credit scenario by fault, the trials' outcomes per system,
every loopwright trial that did not succeed with how it ended (the runtime's costs are there),
and the long-chain illustration.

`experiment_document` is what `--json` prints: the headline and the per-scenario figures as
one versioned document, for scripts that would otherwise parse the Markdown.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopwright_refunds.experiments import matrix
from loopwright_refunds.experiments.metrics import (
    CHAIN_STEPS,
    PER_STEP_RELIABILITY,
    Slice,
    chain_success,
    slices,
    steps_per_task,
    systems_of,
)
from loopwright_refunds.experiments.plots import draw_plots
from loopwright_refunds.experiments.trials import TrialResult


def write_outputs(trials: list[TrialResult], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    measured = slices(trials)
    document = {
        "trials": [t.as_json() for t in trials],
        "slices": [s.as_json() for s in measured],
        "chain": {
            "per_step_reliability": PER_STEP_RELIABILITY,
            "success_by_steps": {n: chain_success(n) for n in CHAIN_STEPS},
            "steps_per_task": steps_per_task(trials),
        },
    }
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "report.md").write_text(markdown(trials, measured))
    draw_plots(trials, measured, out)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(row) + " |" for row in rows],
    ]


def headline(measured: list[Slice]) -> list[str]:
    """One row per system over every trial: the table docs/experiments.md quotes."""
    header = [
        "system",
        "trials",
        "task success",
        "unauthorized actions",
        "duplicate effects",
        "policy-violating refunds",
        "UNKNOWN p50 / p95",
        "recovery",
        "p95 latency",
        "model calls / success",
        "tokens / success",
    ]
    rows = [
        [
            s.system,
            str(s.trials),
            f"{_pct(s.success_rate)} ({s.successes})",
            f"{_pct(s.unauthorized_rate)} ({s.unauthorized_effects})",
            f"{_pct(s.duplicate_rate)} ({s.duplicate_effects})",
            f"{_pct(s.policy_rate)} ({s.policy_violations})",
            "n/a"
            if s.unknown_windows is None
            else f"{_secs(s.unknown_p50_s)} / {_secs(s.unknown_p95_s)} ({s.unknown_windows})",
            f"{_pct(s.recovery_rate)} ({s.recovered}/{s.crashed})",
            _secs(s.latency_p95_s),
            _num(s.calls_per_success),
            _num(s.tokens_per_success),
        ]
        for s in measured
        if s.dimension == "all"
    ]
    return _table(header, rows)


def side_by_side(measured: list[Slice], dimension: str, *, policy: bool = False) -> list[str]:
    """Per value of `dimension`: duplicates, unauthorized (with `policy`: policy-violating
    refunds) and success of every system."""
    systems = list(dict.fromkeys(s.system for s in measured))
    by = {(s.system, s.value): s for s in measured if s.dimension == dimension}
    values = list(dict.fromkeys(s.value for s in measured if s.dimension == dimension))
    figures = "dup / unauth / policy / success" if policy else "dup / unauth / success"
    header = [dimension] + [f"{system}: {figures}" for system in systems]

    def cell(s: Slice | None) -> str:
        if s is None:
            return "—"
        counts = [s.duplicate_effects, s.unauthorized_effects]
        counts += [s.policy_violations] if policy else []
        return " / ".join(map(str, counts)) + f" / {_pct(s.success_rate)} of {s.trials}"

    return _table(header, [[v] + [cell(by.get((system, v))) for system in systems] for v in values])


def outcomes(trials: list[TrialResult], system: str) -> dict[str, int]:
    """How many of `system`'s trials had each outcome kind (a trial can have several)."""
    return dict(Counter(k for t in trials if t.system == system for k in t.outcome_kinds))


def _outcomes(trials: list[TrialResult]) -> list[str]:
    systems = systems_of(trials)
    counted = {system: outcomes(trials, system) for system in systems}
    kinds = list(dict.fromkeys(k for found in counted.values() for k in found))
    rows = [[kind] + [str(counted[s].get(kind, 0)) for s in systems] for kind in kinds]
    return [
        "Trials per outcome: done (the expected business outcome), or each way it was not "
        '(a trial can have several; "error": the system itself raised).',
        "",
        *_table(["outcome", *systems], rows),
    ]


def _failures(trials: list[TrialResult], system: str) -> list[str]:
    rows = [
        [t.scenario, t.fault, str(t.repetition), t.outcome, t.end or "", t.error or ""]
        for t in trials
        if t.system == system and not t.success
    ]
    if not rows:
        return [f"Every {system} trial succeeded."]
    return _table(["scenario", "fault", "rep", "outcome", "how it ended", "error"], rows)


def _chain(trials: list[TrialResult]) -> list[str]:
    lines = [
        f"With {PER_STEP_RELIABILITY:.0%} reliability per step and independent steps, an n-step "
        "chain succeeds with probability 0.99^n:",
        "",
        *_table(["steps n", "0.99^n"], [[str(n), f"{chain_success(n):.3f}"] for n in CHAIN_STEPS]),
    ]
    measured = steps_per_task(trials)
    if measured:
        where = ", ".join(
            f"{length} tasks take {calls:.0f} model calls (0.99^{calls:.0f} = "
            f"{chain_success(round(calls)):.2f})"
            for length, calls in measured.items()
        )
        lines += ["", f"In this experiment {where}. See `chain.png`."]
    return lines


SECTIONS: list[tuple[str, Callable[[list[TrialResult], list[Slice]], list[str]]]] = [
    ("Headline: every trial", lambda _t, m: headline(m)),
    ("By fault", lambda _t, m: side_by_side(m, "fault")),
    ("By task length", lambda _t, m: side_by_side(m, "length")),
    ("By concurrency", lambda _t, m: side_by_side(m, "concurrency")),
    ("By scenario", lambda _t, m: side_by_side(m, "scenario", policy=True)),
    ("Crash points, one by one", lambda _t, m: side_by_side(m, "crash point")),
    (
        "Keyless downstream (store credit), by fault",
        lambda _t, m: side_by_side(m, "keyless fault"),
    ),
    ("Outcomes", lambda t, _m: _outcomes(t)),
    ("loopwright trials that did not succeed", lambda t, _m: _failures(t, "loopwright")),
    ("Long chains", lambda t, _m: _chain(t)),
]


def markdown(trials: list[TrialResult], measured: list[Slice]) -> str:
    repetitions = len({t.repetition for t in trials})
    lines = [
        "# loopwright fault-injection experiment",
        "",
        f"{len(trials)} trials: {repetitions} seeded "
        f"{'repetition' if repetitions == 1 else 'repetitions'} of the matrix, systems "
        f"{', '.join(systems_of(trials))}. Every figure is judged in the business system (the "
        "payment service's refunds and store-credit ledger, the orders' balances). `dup` counts "
        "extra refunds or credit entries for one intent, `unauth` refunds on another user's "
        "order, outside the task, or over the approval threshold without an approval, and "
        "credits to another customer, `policy` refunds the refund policy did not allow (an order "
        "not delivered, outside the window, above the refundable balance, another currency). "
        "Plots: effects.png, success.png, latency.png, "
        "unknown.png, chain.png.",
    ]
    for title, section in SECTIONS:
        lines += ["", f"## {title}", "", *section(trials, measured)]
    lines += ["", "## The matrix", "", *(matrix.__doc__ or "").strip().splitlines()]
    return "\n".join(lines) + "\n"


SCHEMA = "loopwright.experiment/1"
# A system's headline figures in the document, as `metrics.Slice` names them.
HEADLINE_FIELDS = (
    "trials",
    "successes",
    "success_rate",
    "unauthorized_trials",
    "unauthorized_effects",
    "unauthorized_rate",
    "duplicate_trials",
    "duplicate_effects",
    "duplicate_rate",
    "policy_trials",
    "policy_violations",
    "policy_rate",
    "unknown_windows",
    "unknown_p50_s",
    "unknown_p95_s",
    "crashed",
    "recovered",
    "recovery_rate",
    "latency_p50_s",
    "latency_p95_s",
    "calls_per_success",
    "tokens_per_success",
    "errors",
)
SCENARIO_FIELDS = (
    "trials",
    "successes",
    "success_rate",
    "duplicate_trials",
    "duplicate_effects",
    "unauthorized_trials",
    "unauthorized_effects",
    "policy_trials",
    "policy_violations",
)


def experiment_document(trials: list[TrialResult], out: Path) -> dict[str, Any]:
    """The `--json` document (`loopwright.experiment/1`): the headline per system, with its
    outcome counts, and one row per scenario and system. Within the version fields are only
    added; a change of meaning is a new version, as for the CLI's documents."""
    measured = slices(trials)
    by_scenario = [s for s in measured if s.dimension == "scenario"]
    order = list(dict.fromkeys(s.value for s in by_scenario))  # the matrix's, then by system

    def picked(s: Slice, names: tuple[str, ...]) -> dict[str, Any]:
        figures = s.as_json()
        return {name: figures[name] for name in names}

    return {
        "schema": SCHEMA,
        "trials": len(trials),
        "repetitions": len({t.repetition for t in trials}),
        "results": str(out / "results.json"),
        "report": str(out / "report.md"),
        "systems": [
            {
                "system": s.system,
                **picked(s, HEADLINE_FIELDS),
                "outcomes": outcomes(trials, s.system),
            }
            for s in measured
            if s.dimension == "all"
        ],
        "scenarios": [
            {"scenario": s.value, "system": s.system, **picked(s, SCENARIO_FIELDS)}
            for s in sorted(by_scenario, key=lambda s: order.index(s.value))
        ],
    }
