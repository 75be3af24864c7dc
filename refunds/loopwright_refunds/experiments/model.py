"""The model every system is driven by: the scripted policy, with a provider's call ids and bill.

Two things differ from `ScriptedChatModel`, both to make the comparison fair to real deployments:

* Call ids are unique per response, as a provider's are. The scripted model derives them from
  the conversation, which would hand a baseline that keys its writes by call id a deduplication
  no real model gives it (a fresh process asking again would get the same ids).
* Every request is metered into a ledger file (one JSON line per call, appended atomically), so
  model calls and tokens are counted even for processes that were killed mid-run: the ledger is
  the provider's bill, not the runtime's own account.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from loopwright.models.scripted import Policy, ScriptedChatModel
from loopwright_refunds.experiments.actor import ActsBeforeWrite, ConcurrentChange
from loopwright_refunds.experiments.policy import ExperimentPolicy
from loopwright_refunds.services.endpoints import ServiceEndpoints


class MeteredModel(ScriptedChatModel):
    """A scripted model with provider-like call ids that bills each request to `ledger`."""

    ledger: Path

    def _decide(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> tuple[str, list[Any], str]:
        content, calls, message_id = super()._decide(messages, tools)
        calls = [dataclasses.replace(call, id=f"call_{uuid.uuid4().hex[:16]}") for call in calls]
        usage = self._usage(messages, content, calls)
        line = json.dumps({"input": usage["input_tokens"], "output": usage["output_tokens"]})
        # O_APPEND makes each line one atomic write, whoever else appends to the ledger.
        fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        return content, calls, message_id


@dataclasses.dataclass(frozen=True)
class Bill:
    """What a trial cost in model use, across every process that worked on it."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def read_bill(ledger: Path) -> Bill:
    if not ledger.exists():
        return Bill()
    lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return Bill(
        calls=len(lines),
        input_tokens=sum(line["input"] for line in lines),
        output_tokens=sum(line["output"] for line in lines),
    )


def experiment_model(
    ledger: Path,
    change: ConcurrentChange | None = None,
    endpoints: ServiceEndpoints | None = None,
) -> MeteredModel:
    """The experiment's model; with `change`, another actor changes the order mid-run."""
    policy: Policy = ExperimentPolicy()
    if change is not None:
        assert endpoints is not None, "a concurrent change is made on the services"
        policy = ActsBeforeWrite(policy, change, endpoints)
    return MeteredModel(policy=policy, ledger=ledger)
