"""The eight metrics, per system and per slice (fault, task length, concurrency, scenario, crash
point, and the keyless store-credit scenario by fault).

* task success: the trial's refunds and credit entries are exactly the expected ones, all
  authorized, balances agree (`experiments.truth`);
* unauthorized action rate: trials with at least one unauthorized refund or credit;
* duplicate business effect rate: trials with at least one order refunded twice, or one customer
  credited twice, by one task;
* policy-violating refund rate: trials with at least one refund the refund policy did not allow
  (not delivered, outside the window, above the refundable balance, another currency);
* UNKNOWN duration: p50 / p95 of the windows in which a write's outcome was unknown (loopwright's
  journal; the baselines record no such thing);
* recovery success rate: trials in which a process died mid-run that still ended verified;
* p95 end-to-end latency;
* cost per successful task: model calls and tokens of every trial in the slice, failed ones
  included, divided by the successful ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from loopwright_refunds.experiments.scenarios import KEYLESS
from loopwright_refunds.experiments.trials import TrialResult

SYSTEM_ORDER = ("loopwright", "prebuilt", "plain_loop")
PER_STEP_RELIABILITY = 0.99
CHAIN_STEPS = (1, 5, 10, 25, 50, 100, 200)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class Slice:
    """The metrics of one system over one slice of the trials."""

    system: str
    # "all", "fault", "length", "concurrency", "scenario", "crash point", "keyless fault"
    dimension: str
    value: str
    trials: int
    successes: int
    success_rate: float | None
    unauthorized_trials: int
    unauthorized_effects: int
    unauthorized_rate: float | None
    duplicate_trials: int
    duplicate_effects: int
    duplicate_rate: float | None
    policy_trials: int
    policy_violations: int
    policy_rate: float | None
    unknown_windows: int | None  # None: the system keeps no record of unknown outcomes
    unknown_p50_s: float | None
    unknown_p95_s: float | None
    crashed: int
    recovered: int
    recovery_rate: float | None
    latency_p50_s: float | None
    latency_p95_s: float | None
    model_calls: int
    tokens: int
    calls_per_success: float | None
    tokens_per_success: float | None
    errors: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(system: str, dimension: str, value: str, trials: list[TrialResult]) -> Slice:
    successes = sum(t.success for t in trials)
    recorded = [t.unknown_windows_s for t in trials if t.unknown_windows_s is not None]
    windows = [w for ws in recorded for w in ws]
    crashed = [t for t in trials if t.crashed]
    latencies = [t.latency_s for t in trials]
    calls = sum(t.model_calls for t in trials)
    tokens = sum(t.input_tokens + t.output_tokens for t in trials)
    return Slice(
        system=system,
        dimension=dimension,
        value=value,
        trials=len(trials),
        successes=successes,
        success_rate=_ratio(successes, len(trials)),
        unauthorized_trials=sum(t.unauthorized > 0 for t in trials),
        unauthorized_effects=sum(t.unauthorized for t in trials),
        unauthorized_rate=_ratio(sum(t.unauthorized > 0 for t in trials), len(trials)),
        duplicate_trials=sum(t.duplicates > 0 for t in trials),
        duplicate_effects=sum(t.duplicates for t in trials),
        duplicate_rate=_ratio(sum(t.duplicates > 0 for t in trials), len(trials)),
        policy_trials=sum(t.policy_violations > 0 for t in trials),
        policy_violations=sum(t.policy_violations for t in trials),
        policy_rate=_ratio(sum(t.policy_violations > 0 for t in trials), len(trials)),
        unknown_windows=len(windows) if recorded else None,
        unknown_p50_s=percentile(windows, 50),
        unknown_p95_s=percentile(windows, 95),
        crashed=len(crashed),
        recovered=sum(t.success for t in crashed),
        recovery_rate=_ratio(sum(t.success for t in crashed), len(crashed)),
        latency_p50_s=percentile(latencies, 50),
        latency_p95_s=percentile(latencies, 95),
        model_calls=calls,
        tokens=tokens,
        calls_per_success=calls / successes if successes else None,
        tokens_per_success=tokens / successes if successes else None,
        errors=sum(t.error is not None for t in trials),
    )


# How each slicing dimension reads a trial.
DIMENSIONS: dict[str, Callable[[TrialResult], str]] = {
    "fault": lambda t: t.fault_kind,
    "length": lambda t: "long" if t.long else "short",
    "concurrency": lambda t: "concurrent" if t.concurrent else "none",
    "scenario": lambda t: t.scenario,
    "crash point": lambda t: t.fault.removeprefix("crash@") if t.fault_kind == "crash" else "",
    "keyless fault": lambda t: t.fault if t.scenario == KEYLESS else "",
}


def systems_of(trials: Iterable[TrialResult]) -> list[str]:
    present = {t.system for t in trials}
    return [s for s in SYSTEM_ORDER if s in present]


def slices(trials: list[TrialResult]) -> list[Slice]:
    """Every system over all its trials, then over each value of each dimension."""
    found = []
    for system in systems_of(trials):
        own = [t for t in trials if t.system == system]
        found.append(measure(system, "all", "all", own))
        for dimension, read in DIMENSIONS.items():
            values = dict.fromkeys(read(t) for t in own)  # first-seen order: the matrix's
            for value in values:
                if value:
                    group = [t for t in own if read(t) == value]
                    found.append(measure(system, dimension, value, group))
    return found


def chain_success(steps: int, reliability: float = PER_STEP_RELIABILITY) -> float:
    """The chance an n-step chain succeeds when each step does independently with `reliability`."""
    return float(reliability**steps)


def unfaulted_calls(trials: list[TrialResult]) -> dict[str, list[int]]:
    """Model calls of each unfaulted loopwright trial, short and long tasks (those with any)."""
    found: dict[str, list[int]] = {}
    for length in ("short", "long"):
        calls = [
            t.model_calls
            for t in trials
            if t.fault == "none" and t.system == "loopwright" and t.long == (length == "long")
        ]
        if calls:
            found[length] = calls
    return found


def steps_per_task(trials: list[TrialResult]) -> dict[str, float]:
    """Mean model calls of an unfaulted loopwright trial, short and long tasks: where the
    experiment's tasks sit on the chain curve."""
    return {length: sum(c) / len(c) for length, c in unfaulted_calls(trials).items()}
