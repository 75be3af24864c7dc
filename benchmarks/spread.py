"""A benchmark's figure over its rounds, and a ratio judged against its goal by where its median
lies, not by the median alone: a shared machine's slow moments skew single runs."""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass

MEDIAN_CONFIDENCE = 0.95
MIN_ROUNDS_FOR_CONFIDENCE = 6  # below, no pair of order statistics holds the median 95% sure


@dataclass(frozen=True)
class Spread:
    """A figure over the rounds: its median, the median's 95% interval, quartiles, extremes."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def interval(self) -> tuple[float, float]:
        """Where the median lies, 95% sure: the order statistics x(j) and x(n+1-j) with the
        largest j for which P(Binomial(n, 1/2) < j) <= 2.5% (distribution-free: the rounds'
        times are skewed by the machine's slow moments, not normal). With fewer than six rounds
        no j qualifies, and it is all of them."""
        ordered = sorted(self.values)
        n = len(ordered)
        j = 1
        while j < n // 2 and 2 * _binomial_cdf(n, j) <= 1 - MEDIAN_CONFIDENCE:
            j += 1
        return ordered[j - 1], ordered[n - j]

    def show(self, unit: str = "", digits: int = 2) -> str:
        q = statistics.quantiles(self.values, n=4) if len(self.values) > 1 else [self.median] * 3
        low, high = self.interval
        sure = (
            "95% sure"
            if len(self.values) >= MIN_ROUNDS_FOR_CONFIDENCE
            else "too few rounds to be sure"
        )
        f = f"{{:.{digits}f}}"
        return (
            f"{f.format(self.median)}{unit} ({sure} of the median within "
            f"{f.format(low)}-{f.format(high)}; middle half {f.format(q[0])}-{f.format(q[2])}, "
            f"all {f.format(min(self.values))}-{f.format(max(self.values))}, "
            f"{len(self.values)} rounds)"
        )


def _binomial_cdf(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


class Verdict(enum.Enum):
    """A ratio against its goal, judged on the interval of its median, not the median alone."""

    MET = "met"
    MISSED = "MISSED"
    AT_THE_GOAL = "at the goal: the median's interval holds it, more rounds may tell"

    @classmethod
    def of(cls, spread: Spread, goal: float) -> Verdict:
        low, high = spread.interval
        return cls.MET if high <= goal else cls.MISSED if low > goal else cls.AT_THE_GOAL
