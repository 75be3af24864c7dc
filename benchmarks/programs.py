"""A program action against the loop it replaces: "refund each eligible order of mine".

    python -m benchmarks.programs [--sizes 1 5 20] [--db SERVER_URL]

For each size N, N fresh orders of user u-1 (20.00 each, delivered now: eligible, under the
approval threshold, so no run waits for a person) are refunded by the reference agent with the
scripted model, two ways, on one Postgres and the reference services:

- loop: one tool call per model step, as a model without programs works (get_order, then
  submit_refund, for each order in turn, then the answer): 2N + 1 model steps;
- program: one model step writes a program that makes the same calls (`run_program`), and one
  more gives the answer: 2 model steps, whatever N.

Every call is the same in both: checked, journaled, sent under its intent key. After one
warm-up run of each way, each way runs `--repeats` times per size on orders of its own, timed
(the median wall time of the run, in this process, the two ways taking turns), and once more
with every database connection traced (`benchmarks.db_work`: transactions, statements, round
trips, bytes sent), since tracing slows the client. Each run must end COMPLETED with one refund
per order. Printed per refund, side by side, with the loop's figure over the program's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from benchmarks.db_work import DbWork, traced_connections
from benchmarks.perf_setup import Bench, bench_environment
from loopwright import Budget, Decision, Principal, ScriptedChatModel, parse_tool_content
from loopwright.runner import open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.admin import create_order, list_refunds

AMOUNT = "20.00"
# What the program does: the loop's calls, in one model step.
REFUND_EACH = """\
refunded = {}
for order_id in orders:
    order = get_order(order_id=order_id)
    refund = submit_refund(order_id=order_id, amount=order["refundable"],
                           currency=order["currency"], reason="refund each eligible order")
    refunded[order_id] = refund["refund_id"]
refunded
"""


def _answers(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def one_call_per_step(orders: list[str]) -> Callable[..., Decision]:
    """The loop: get_order, then submit_refund of what it read, order after order."""

    def policy(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
        answers = _answers(messages)
        if len(answers) == 2 * len(orders):
            return Decision(content=f"Refunded {len(orders)} orders.")
        order_id = orders[len(answers) // 2]
        if len(answers) % 2 == 0:
            return Decision(tool_calls=[("get_order", {"order_id": order_id})])
        order = parse_tool_content(str(answers[-1].content)).result
        refund = {
            "order_id": order_id,
            "amount": order["refundable"],
            "currency": order["currency"],
            "reason": "refund each eligible order",
        }
        return Decision(tool_calls=[("submit_refund", refund)])

    return policy


def one_program(orders: list[str]) -> Callable[..., Decision]:
    """The program: the same calls, written once."""

    def policy(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            return Decision.program(REFUND_EACH, {"orders": orders})
        return Decision(content=f"Refunded {len(orders)} orders.")

    return policy


WAYS: dict[str, Callable[[list[str]], Callable[..., Decision]]] = {
    "loop": one_call_per_step,
    "program": one_program,
}


@dataclass(frozen=True)
class Figures:
    """One way at one size, per refund."""

    model_steps: float
    wall_ms: float
    work: DbWork


class Orders:
    """Fresh eligible orders of u-1, numbered so that no two runs share one."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.next = 900_000

    def make(self, count: int) -> list[str]:
        made = []
        for _ in range(count):
            self.next += 1
            order_id = f"O-{self.next}"
            create_order(self.bench.endpoints, order_id, owner="u-1", amount=AMOUNT)
            made.append(order_id)
        return made


def run_once(bench: Bench, way: str, orders: list[str], run_id: str) -> tuple[int, float]:
    """One run of `way` over `orders`: its model steps and its wall time (s). Checked: it ended
    COMPLETED, with one refund of each order."""
    model = ScriptedChatModel(policy=WAYS[way](orders))
    budget = Budget(max_steps=2 * len(orders) + 5, max_tool_attempts=4 * len(orders) + 10)
    principal = Principal(user_id="u-1", scope=tuple(f"order:{o}" for o in orders))
    task = "Refund each eligible order of mine."
    with (
        connect(bench.endpoints) as deps,
        open_runner(bench.database_url, refunds, deps=deps, model=model, budget=budget) as runner,
    ):
        started = time.perf_counter()
        outcome = runner.start(task, principal, run_id=run_id)
        wall = time.perf_counter() - started
        steps = int(runner.state(run_id)["usage"]["model_requests"])
    if outcome.stop_reason != "completed":
        raise RuntimeError(f"{way} over {len(orders)} orders: {outcome.stop_detail}")
    if any(len(list_refunds(bench.endpoints, o)) != 1 for o in orders):
        raise RuntimeError(f"{way} over {len(orders)} orders: not one refund each")
    return steps, wall


def measure(bench: Bench, sizes: Sequence[int], repeats: int) -> dict[tuple[int, str], Figures]:
    orders = Orders(bench)
    for way in WAYS:  # the first run of a process pays for imports and compiling the graph
        run_once(bench, way, orders.make(1), f"warm-{way}")
    figures: dict[tuple[int, str], Figures] = {}
    for size in sizes:
        timed: dict[str, list[tuple[int, float]]] = {way: [] for way in WAYS}
        for repeat in range(repeats):
            for way in WAYS:
                run_id = f"timed-{way}-{size}-{repeat}"
                timed[way].append(run_once(bench, way, orders.make(size), run_id))
        for way in WAYS:
            with tempfile.TemporaryDirectory(prefix="lw-programs-") as tmp:
                with traced_connections(Path(tmp)) as traces:
                    run_once(bench, way, orders.make(size), f"traced-{way}-{size}")
                work = traces.collect()
            steps = statistics.median(s for s, _ in timed[way])
            wall = statistics.median(w for _, w in timed[way])
            figures[size, way] = Figures(steps / size, 1000 * wall / size, work)
    return figures


def report(figures: dict[tuple[int, str], Figures]) -> list[str]:
    lines = [
        "per refund                 loop   program   loop/program",
    ]
    for size in sorted({size for size, _ in figures}):
        loop, program = figures[size, "loop"], figures[size, "program"]
        rows: list[tuple[str, float, float]] = [
            ("model steps", loop.model_steps, program.model_steps),
            ("wall time (ms)", loop.wall_ms, program.wall_ms),
            ("db transactions", loop.work.transactions / size, program.work.transactions / size),
            ("db statements", loop.work.statements / size, program.work.statements / size),
            ("db round trips", loop.work.round_trips / size, program.work.round_trips / size),
            ("db bytes sent", loop.work.bytes_sent / size, program.work.bytes_sent / size),
        ]
        lines.append(f"{size} orders:")
        lines += [
            f"  {name:<22} {a:>7.1f} {b:>9.1f}   {a / b if b else float('inf'):.2f}x"
            for name, a, b in rows
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.programs", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per way and size")
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        figures = measure(bench, args.sizes, args.repeats)
    print("\n".join(report(figures)))


if __name__ == "__main__":
    main()
