"""Checkpoint storage grows linearly with the number of steps (history and evidence are deltas)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from loopwright.graph.budget import Budget
from loopwright.models.scripted import ScriptedChatModel
from loopwright_refunds.long_task import KeepsReading
from tests.runtime_fixtures import RunnerFactory, principal

STEPS = 200
WINDOW = 50

SIZE_SQL = """
SELECT
  (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
     FROM checkpoints WHERE thread_id = %(t)s)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %(t)s)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s)
"""


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_checkpoint_bytes_per_step_stay_flat_over_200_steps(
    database_url: str, open_test_runner: RunnerFactory
) -> None:
    task = "Read orders O-42, O-43 and O-44 in turn, again and again."
    model = ScriptedChatModel(policy=KeepsReading(reads=STEPS))
    sizes: list[int] = []
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        open_test_runner(
            model=model,
            budget=Budget(max_steps=STEPS + 5, max_tool_attempts=STEPS * 3, max_input_tokens=10**9),
        ) as runner,
    ):
        run_id = "run-growth"

        def measure(node: str, _update: dict[str, Any]) -> None:
            if node == "model_step":
                row = conn.execute(SIZE_SQL, {"t": run_id}).fetchone()
                assert row is not None
                sizes.append(int(row[0]))

        outcome = runner.start(task, principal(task=task), run_id=run_id, on_step=measure)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        assert len(runner.state(run_id)["history"]) == 2 * STEPS + 2
    assert len(sizes) == STEPS + 1
    first = (sizes[WINDOW] - sizes[0]) / WINDOW
    last = (sizes[STEPS] - sizes[STEPS - WINDOW]) / WINDOW
    print(
        f"bytes/step: first {WINDOW} steps {first:.0f}, last {WINDOW} steps {last:.0f}, ratio {last / first:.2f}"
    )
    assert last <= 1.5 * first
