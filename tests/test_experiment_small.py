"""A small run of the fault-injection experiment, as CI runs it (about a minute).

One repetition of a reduced matrix: the partial refund (where a second refund fits the balance,
so a duplicate shows) without a fault, with the payment service timing out after applying the
refund, and with the process killed right after the refund was sent; plus another user's order;
plus one keyless cell: loopwright giving store credit (no idempotency key downstream) with the
process killed before the request left, so that a new process finds the credit absent by its
pre-image, waits out the request's deadline, sends it again and credits the customer once; plus
the model that skips the policy (refunds asked for at once, without a read, on an order delivered
outside the window, one not delivered and one above its refundable balance). loopwright must end
every trial with the expected business outcome, with no duplicate, no unauthorized and no
policy-violating refund; the baselines must show the duplicate a timeout-as-failure produces and
let the out-of-window and the undelivered refund through.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopwright_refunds.experiments.faults import Fault, FaultKind
from loopwright_refunds.experiments.matrix import Cell, full_matrix, select
from loopwright_refunds.experiments.run import Settings, run_experiment
from loopwright_refunds.experiments.scenarios import KEYLESS, SKIPS_POLICY

CRASH_BEFORE_SEND = Fault(FaultKind.CRASH, ("executor:after_dispatch_record",))


@pytest.mark.slow
@pytest.mark.postgres
def test_small_experiment_loopwright_has_no_duplicates_nor_unauthorized_actions(
    postgres_server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "experiment"
    cells = select(
        full_matrix(),
        scenarios=("partial", "other_users_order", SKIPS_POLICY),
        faults=("none", "accept_then_timeout", "crash@executor:after_send"),
    )
    keyless = Cell(KEYLESS, CRASH_BEFORE_SEND, "loopwright")
    settings = Settings(
        repetitions=1, out=out, database_server=postgres_server_url, cells=[*cells, keyless]
    )
    results = run_experiment(settings)

    assert len(results) == 16
    ours = [r for r in results if r.system == "loopwright"]
    assert sum(r.duplicates for r in ours) == 0
    assert sum(r.unauthorized for r in ours) == 0
    assert sum(r.policy_violations for r in ours) == 0
    assert all(r.success for r in ours), [(r.scenario, r.fault, r.end, r.error) for r in ours]
    timeouts = [r for r in results if r.system != "loopwright" and r.fault == "accept_then_timeout"]
    assert sum(r.duplicates for r in timeouts) >= 1
    others = [r for r in results if r.system != "loopwright" and r.scenario == "other_users_order"]
    assert all(r.unauthorized == 1 for r in others)
    skipped = [r for r in results if r.system != "loopwright" and r.scenario == SKIPS_POLICY]
    # payments itself refuses the amount above the balance; nothing checks the rest
    assert [sorted(r.policy_reasons) for r in skipped] == [["delivery", "window"]] * 2
    [credit] = [r for r in results if r.scenario == KEYLESS]
    assert credit.crashed and credit.credits == credit.expected_credits
    assert (
        len(credit.unknown_windows_s or []) == 1
    )  # reconciled, absent, re-sent after its deadline

    document = json.loads((out / "results.json").read_text())
    assert len(document["trials"]) == 16
    report = (out / "report.md").read_text()
    assert "## Headline: every trial" in report and "policy-violating refunds" in report
    for plot in ("effects", "success", "latency", "unknown", "chain"):
        assert (out / f"{plot}.png").stat().st_size > 0
