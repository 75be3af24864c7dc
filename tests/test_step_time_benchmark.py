"""`benchmarks.step_time` judges a ratio by where its median lies, not by the median alone."""

from __future__ import annotations

import random

from benchmarks.step_time import MEDIAN_CONFIDENCE, Spread, Verdict


def test_the_medians_interval_is_the_order_statistics_the_binomial_gives() -> None:
    # n = 15: x(4) and x(12), 96.5% sure (x(5) and x(11) would be only 88%).
    assert Spread(tuple(float(i) for i in range(1, 16))).interval == (4.0, 12.0)
    # Fewer than six rounds cannot be 95% sure of anything narrower than all of them.
    assert Spread((3.0, 1.0, 2.0, 5.0, 4.0)).interval == (1.0, 5.0)


def test_the_medians_interval_holds_the_true_median_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, held = 2000, 0
    for _ in range(trials):
        # Skewed like a machine's slow moments: the true median of lognormvariate(0, 1) is 1.
        spread = Spread(tuple(rng.lognormvariate(0, 1) for _ in range(30)))
        low, high = spread.interval
        held += low <= 1.0 <= high
    assert held / trials >= MEDIAN_CONFIDENCE - 0.015


def test_a_goal_inside_the_interval_is_neither_met_nor_missed() -> None:
    centred = Spread(tuple(1.20 + 0.01 * i for i in range(11)))  # 1.20 .. 1.30
    assert Verdict.of(centred, 1.25) is Verdict.AT_THE_GOAL
    assert Verdict.of(centred, 1.40) is Verdict.MET
    assert Verdict.of(centred, 1.10) is Verdict.MISSED
