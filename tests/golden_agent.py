"""The refund agent as the golden runs are made and replayed with (tests/test_golden_runs.py).

A golden run is replayed months after it was parked: its approval must not have expired, nor
its end-to-end deadline passed, for the replay to test what the code does with it rather than
the calendar. Everything else is the reference agent's own.
"""

from __future__ import annotations

from datetime import timedelta

from loopwright_refunds.agent import agent as refunds

CENTURY_S = 100 * 365 * 24 * 3600.0

agent = refunds.replace(
    approval_ttl=timedelta(seconds=CENTURY_S),
    budget=refunds.budget.model_copy(update={"deadline_s": CENTURY_S}),
)
