"""The experiment's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from loopwright_refunds.experiments.metrics import (
    PER_STEP_RELIABILITY,
    Slice,
    chain_success,
    steps_per_task,
)
from loopwright_refunds.experiments.trials import TrialResult

COLORS = {"loopwright": "#2b6cb0", "prebuilt": "#dd6b20", "plain_loop": "#718096"}


def _bars(ax: Axes, measured: list[Slice], metric: str, title: str) -> None:
    faults = list(dict.fromkeys(s.value for s in measured if s.dimension == "fault"))
    systems = list(dict.fromkeys(s.system for s in measured))
    width = 0.8 / max(1, len(systems))
    by = {(s.system, s.value): s for s in measured if s.dimension == "fault"}
    for i, system in enumerate(systems):
        heights = [
            getattr(by[(system, f)], metric) or 0.0 if (system, f) in by else 0.0 for f in faults
        ]
        positions = [x + i * width for x in range(len(faults))]
        ax.bar(positions, heights, width, label=system, color=COLORS.get(system))
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(faults))])
    ax.set_xticklabels(faults, rotation=30, ha="right", fontsize=8)
    ax.set_title(title)
    if metric.endswith("_rate"):
        ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)


def _save(figure: plt.Figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw_plots(trials: list[TrialResult], measured: list[Slice], out: Path) -> None:
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    _bars(top, measured, "duplicate_rate", "trials with a duplicate refund or credit, by fault")
    _bars(
        bottom,
        measured,
        "unauthorized_rate",
        "trials with an unauthorized refund or credit, by fault",
    )
    _save(figure, out / "effects.png")

    figure, ax = plt.subplots(figsize=(10, 4.5))
    _bars(ax, measured, "success_rate", "task success (verified in the business system), by fault")
    _save(figure, out / "success.png")

    figure, ax = plt.subplots(figsize=(10, 4.5))
    _bars(ax, measured, "latency_p95_s", "p95 end-to-end latency (s), by fault")
    _save(figure, out / "latency.png")

    windows = [w for t in trials if t.unknown_windows_s for w in t.unknown_windows_s]
    figure, ax = plt.subplots(figsize=(7, 4))
    ax.hist(windows or [0.0], bins=30, color=COLORS["loopwright"])
    ax.set_xlabel("seconds from the unanswered send to the settled outcome")
    ax.set_ylabel("writes")
    ax.set_title(f"loopwright: how long a write's outcome stayed UNKNOWN ({len(windows)} writes)")
    _save(figure, out / "unknown.png")

    figure, ax = plt.subplots(figsize=(7, 4))
    steps = list(range(0, 201))
    ax.plot(steps, [chain_success(n) for n in steps], color="black")
    for length, calls in steps_per_task(trials).items():
        ax.axvline(calls, linestyle="--", color=COLORS["loopwright"])
        ax.annotate(f"{length} task ({calls:.0f} steps)", (calls, chain_success(round(calls))))
    ax.axvline(50, linestyle=":", color="gray")
    ax.annotate(f"0.99^50 = {chain_success(50):.2f}", (50, chain_success(50)))
    ax.set_xlabel("steps in the chain")
    ax.set_ylabel("P(every step succeeds)")
    ax.set_title(f"an n-step chain at {PER_STEP_RELIABILITY:.0%} per step")
    _save(figure, out / "chain.png")
