"""The experiment's PNG plots (matplotlib, Agg backend: no display needed).

The bar plots are read for their zeros as much as for their bars ("no duplicate for loopwright"):
a bar of height 0 draws nothing, which reads as missing data. So every bar carries its counts
("3/12": trials with the effect / trials; "n=12" for latency), a bar of height 0 gets a stub in
its colour on the axis, and a slice with no trials says "n/a". Each system's legend entry names
its number of trials.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from loopwright_refunds.experiments.metrics import (
    PER_STEP_RELIABILITY,
    Slice,
    chain_success,
    unfaulted_calls,
)
from loopwright_refunds.experiments.trials import TrialResult

COLORS = {"loopwright": "#2b6cb0", "prebuilt": "#dd6b20", "plain_loop": "#718096"}
ZERO_BARS = "_zero bars"  # the label of a system's zero stubs (leading "_": not in the legend)


def _bars(
    ax: Axes,
    measured: list[Slice],
    metric: str,
    counts: Callable[[Slice], str],
    title: str,
    ylabel: str,
) -> None:
    """One bar per system and fault kind: `metric`'s value, labelled with `counts`."""
    faults = list(dict.fromkeys(s.value for s in measured if s.dimension == "fault"))
    systems = list(dict.fromkeys(s.system for s in measured))
    totals = {s.system: s.trials for s in measured if s.dimension == "all"}
    width = 0.8 / max(1, len(systems))
    by = {(s.system, s.value): s for s in measured if s.dimension == "fault"}
    tallest = 0.0
    for i, system in enumerate(systems):
        found = [by.get((system, f)) for f in faults]
        heights = [float(getattr(s, metric) or 0.0) if s else 0.0 for s in found]
        tallest = max([tallest, *heights])
        positions = [x + i * width for x in range(len(faults))]
        color = COLORS.get(system)
        label = f"{system} (n={totals.get(system, 0)})"
        bars = ax.bar(positions, heights, width, label=label, color=color)
        ax.bar_label(
            bars,
            labels=[counts(s) if s else "n/a" for s in found],
            rotation=90,
            fontsize=7,
            padding=3,
        )
        zeros = [x for x, s, h in zip(positions, found, heights, strict=True) if s and h == 0]
        if zeros:
            ax.hlines(
                [0.0] * len(zeros),
                [x - width / 2 for x in zeros],
                [x + width / 2 for x in zeros],
                colors=color,
                linewidth=4,
                clip_on=False,  # half of the stub lies below the axis
                label=ZERO_BARS,
            )
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(faults))])
    ax.set_xticklabels(faults, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("fault injected")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if metric.endswith("_rate"):
        ax.set_ylim(0, 1.3)  # room above a full bar for its label
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    else:
        ax.set_ylim(0, 1.3 * tallest or 1.0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _share(count: Callable[[Slice], int]) -> Callable[[Slice], str]:
    return lambda s: f"{count(s)}/{s.trials}"


def _unknown(trials: list[TrialResult]) -> Figure:
    recorded = [t for t in trials if t.unknown_windows_s is not None]
    windows = [w for t in recorded for w in t.unknown_windows_s or []]
    figure, ax = plt.subplots(figsize=(7, 4))
    if windows:
        ax.hist(windows, bins=30, color=COLORS["loopwright"])
    else:  # an empty histogram would look like a plot that failed
        ax.text(0.5, 0.5, "no write's outcome was UNKNOWN", ha="center", transform=ax.transAxes)
    ax.set_xlabel("seconds from the unanswered send to the settled outcome")
    ax.set_ylabel("writes")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # writes come whole
    writes = "1 write" if len(windows) == 1 else f"{len(windows)} writes"
    ax.set_title(
        f"loopwright: how long a write's outcome stayed UNKNOWN\n({writes} in {len(recorded)} trials)"
    )
    return figure


def _chain(trials: list[TrialResult]) -> Figure:
    figure, ax = plt.subplots(figsize=(7, 4))
    steps = list(range(0, 201))
    ax.plot(steps, [chain_success(n) for n in steps], color="black")
    for length, calls in unfaulted_calls(trials).items():
        mean = sum(calls) / len(calls)
        ax.axvline(mean, linestyle="--", color=COLORS["loopwright"])
        ax.annotate(
            f"{length} task ({mean:.0f} steps, n={len(calls)})", (mean, chain_success(round(mean)))
        )
    ax.axvline(50, linestyle=":", color="gray")
    ax.annotate(f"0.99^50 = {chain_success(50):.2f}", (50, chain_success(50)))
    ax.set_xlabel("steps in the chain")
    ax.set_ylabel("P(every step succeeds)")
    ax.set_title(
        f"an n-step chain at {PER_STEP_RELIABILITY:.0%} per step; dashed: loopwright's unfaulted "
        "tasks",
        fontsize=10,
    )
    return figure


def figures(trials: list[TrialResult], measured: list[Slice]) -> dict[str, Figure]:
    """The five plots, by file name without .png."""
    effects, (top, bottom) = plt.subplots(2, 1, figsize=(10, 9))
    _bars(
        top,
        measured,
        "duplicate_rate",
        _share(lambda s: s.duplicate_trials),
        "trials with a duplicate refund or credit, by fault (labels: such trials / trials)",
        "trials with a duplicate",
    )
    _bars(
        bottom,
        measured,
        "unauthorized_rate",
        _share(lambda s: s.unauthorized_trials),
        "trials with an unauthorized refund or credit, by fault (labels: such trials / trials)",
        "trials with an unauthorized effect",
    )
    success, ax = plt.subplots(figsize=(10, 5))
    _bars(
        ax,
        measured,
        "success_rate",
        _share(lambda s: s.successes),
        "task success (verified in the business system), by fault (labels: successes / trials)",
        "trials that succeeded",
    )
    latency, ax = plt.subplots(figsize=(10, 5))
    _bars(
        ax,
        measured,
        "latency_p95_s",
        lambda s: f"n={s.trials}",
        "p95 end-to-end latency, by fault (labels: trials)",
        "p95 latency (s)",
    )
    return {
        "effects": effects,
        "success": success,
        "latency": latency,
        "unknown": _unknown(trials),
        "chain": _chain(trials),
    }


def draw_plots(trials: list[TrialResult], measured: list[Slice], out: Path) -> None:
    for name, figure in figures(trials, measured).items():
        figure.tight_layout()
        figure.savefig(out / f"{name}.png", dpi=110)
        plt.close(figure)
