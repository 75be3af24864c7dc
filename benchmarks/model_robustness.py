"""Weak-model behaviours replayed against the refund agent, through the OpenAI-compatible path.

    python -m benchmarks.model_robustness [--runs 5] [--db SERVER_URL]

Each behaviour is what small models on local servers were seen to do, scripted into the local
OpenAI-compatible server (`tests/openai_server.py`): skip the reads and refund at once (an
order outside the refund window), ask for the wrong amount, say what they would do instead of
calling, write the call in a code fence, have their answer cut at the output limit, stream for
ever. Every run goes through the runtime's own model client (`openai:<model>`, Chat
Completions) and is judged afterwards in the payments service. Per behaviour it prints: runs
that ended typed (a stop reason, not a hang or a crash), refunds that broke a business rule
(outside the window, more than the refundable balance: goal 0), and hangs (runs still going
after the bound: goal 0).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Budget, Decision, Principal, RunOutcome, open_runner
from loopwright.checkpoints.scratch import fresh_database, server_url
from loopwright.models.openai_chat import API_ENV, REASONING_ENV, STREAM_ENV
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect, task_scope
from loopwright_refunds.experiments.progress import Progress
from loopwright_refunds.services.admin import create_order, list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.openai_server import MODEL, OpenAIStub

# A run still going after this long is a hang (its model request bound is 3 s).
HANG_S = 60.0
BUDGET = Budget(max_model_request_s=3.0, max_steps=8)
Behaviour = Callable[[Sequence[BaseMessage], Sequence[dict[str, Any]]], Decision]


def _answered(messages: Sequence[BaseMessage]) -> bool:
    return any(isinstance(m, ToolMessage) for m in messages)


def skips_the_policy(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    if _answered(messages):
        return Decision(content="The refund was submitted successfully.")
    refund = {"order_id": "{late}", "amount": "40.00", "currency": "USD", "reason": "asked"}
    return Decision(tool_calls=[("submit_refund", refund)])


def wrong_amount(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    if _answered(messages):
        return Decision(content="Refunded.")
    refund = {"order_id": "{order}", "amount": "10000.00", "currency": "USD", "reason": "asked"}
    return Decision(tool_calls=[("submit_refund", refund)])


def text_instead_of_a_call(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    return Decision(content="I will now refund the order by calling submit_refund(amount=")


def call_in_a_code_fence(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    call = '{"name": "submit_refund", "arguments": {"order_id": "{order}", "amount": "20.00"}}'
    return Decision(content=f"```json\n{call}\n```")


def cut_answer(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    return Decision(content="Refunded 20.00 USD to ord")


@dataclass(frozen=True)
class Case:
    name: str
    behaviour: Behaviour
    stream: bool = False
    script: Callable[[OpenAIStub], None] = lambda stub: None


CASES = [
    Case("skips reads (ineligible order)", skips_the_policy),
    Case("wrong amount", wrong_amount),
    Case("text instead of a call", text_instead_of_a_call),
    Case("call in a code fence", call_in_a_code_fence),
    Case("cut at the output limit", cut_answer, script=lambda stub: stub.truncate_next()),
    Case(
        "endless stream",
        cut_answer,
        stream=True,
        script=lambda stub: stub.hold_next("trickle"),
    ),
]


@dataclass
class Figures:
    runs: int = 0
    typed: int = 0
    broke_a_rule: int = 0
    hangs: int = 0


@contextmanager
def environment(stub: OpenAIStub, stream: bool) -> Iterator[None]:
    """The runtime's model client configured as an operator would, through the environment."""
    env = {
        "OPENAI_BASE_URL": stub.url,
        "OPENAI_API_KEY": "sk-bench",
        API_ENV: "chat",
        STREAM_ENV: "1" if stream else "0",
        REASONING_ENV: "",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def one_run(url: str, services: ServiceEndpoints, task: str) -> RunOutcome | None:
    """The run's outcome, or None if it did not end within HANG_S (a hang)."""
    ended: list[RunOutcome] = []

    def advance() -> None:
        with (
            connect(services) as deps,
            open_runner(url, refunds, deps=deps, model_spec=f"openai:{MODEL}", budget=BUDGET) as r,
        ):
            ended.append(r.start(task, Principal(user_id="u-1", scope=task_scope(task))))

    thread = threading.Thread(target=advance, daemon=True)
    thread.start()
    thread.join(HANG_S)
    return ended[0] if ended else None


def rule_broken(services: ServiceEndpoints, order_id: str, late_order: str, amount: str) -> int:
    """Refunds that broke the policy: any on the order delivered outside the window, any over
    the order's amount."""
    late = len(list_refunds(services, late_order))
    over = sum(1 for r in list_refunds(services, order_id) if float(r["amount"]) > float(amount))
    return late + over


def measure(case: Case, runs: int, url: str, services: ServiceEndpoints, first: int) -> Figures:
    figures = Figures()
    with Progress(case.name, runs) as progress:
        for n in range(runs):
            order_id, late = f"O-{first + 2 * n}", f"O-{first + 2 * n + 1}"
            create_order(services, order_id, "u-1", "30.00")
            delivered = (datetime.now(UTC) - timedelta(days=90)).isoformat()
            create_order(services, late, "u-1", "40.00", delivered_at=delivered)
            stub = OpenAIStub(policy=_filled(case.behaviour, order_id, late))
            with stub.serving(), environment(stub, case.stream):
                case.script(stub)
                task = f"Check whether order {order_id} and {late} can be refunded and refund them."
                outcome = one_run(url, services, task)
            figures.runs += 1
            progress.advance("hang" if outcome is None else outcome.stop_reason or outcome.phase)
            if outcome is None:
                figures.hangs += 1
            elif outcome.stop_reason:
                figures.typed += 1
            figures.broke_a_rule += rule_broken(services, order_id, late, "30.00")
    return figures


def _filled(behaviour: Behaviour, order_id: str, late: str) -> Behaviour:
    """The behaviour with the run's own orders in its calls and text."""

    def filled(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
        decision = behaviour(messages, tools)
        swap = {"{order}": order_id, "{late}": late}
        calls = [
            (name, {k: swap.get(v, v) if isinstance(v, str) else v for k, v in args.items()})
            for name, args in decision.tool_calls
        ]
        content = decision.content
        for placeholder, value in swap.items():
            content = content.replace(placeholder, value)
        return Decision(content=content, tool_calls=calls)

    return filled


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.model_robustness", description=__doc__
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per behaviour")
    parser.add_argument("--db", help="Postgres server (default: $DATABASE_URL or 127.0.0.1)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(server_url(args.db), prefix="lw_robust"))
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-robust-")))
        services = stack.enter_context(start_services(scratch / "services")).endpoints
        print(
            f"{'behaviour':<32} {'runs':>4} {'ended typed':>11} {'broke a rule':>12} {'hangs':>5}"
        )
        total = Figures()
        for index, case in enumerate(CASES):
            figures = measure(case, args.runs, url, services, 900_000 + 1_000 * index)
            print(
                f"{case.name:<32} {figures.runs:>4} {figures.typed:>11}"
                f" {figures.broke_a_rule:>12} {figures.hangs:>5}",
                flush=True,
            )
            for name in ("runs", "typed", "broke_a_rule", "hangs"):
                setattr(total, name, getattr(total, name) + getattr(figures, name))
        print(
            f"{'all':<32} {total.runs:>4} {total.typed:>11} {total.broke_a_rule:>12} {total.hangs:>5}"
        )
        return 0 if total.broke_a_rule == total.hangs == 0 and total.typed == total.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
