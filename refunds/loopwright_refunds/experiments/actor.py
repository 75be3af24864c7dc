"""Another actor changes an order between our agent reading it and our agent writing it.

The change is made from inside the model call that decides the write, the one moment that is
the same for every system: the agent has read the order, and the refund it is about to propose
rests on that read. The policy still decides on the old read, as a real model would, and the
runtime (or the business system) has to notice.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from loopwright.models.scripted import Decision, Policy
from loopwright_refunds.services.admin import update_order
from loopwright_refunds.services.endpoints import ServiceEndpoints


@dataclass(frozen=True)
class ConcurrentChange:
    """What the other actor does to an order: admin fields, as `services.admin.update_order`."""

    order_id: str
    fields: dict[str, Any]


@dataclass
class ActsBeforeWrite:
    """A `Policy` that lets `change` happen once, just before `inner` first proposes a refund."""

    inner: Policy
    change: ConcurrentChange
    endpoints: ServiceEndpoints
    _done: threading.Event = field(default_factory=threading.Event)

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        decision = self.inner(messages, tools)
        writes = [
            args
            for name, args in decision.tool_calls
            if name == "submit_refund" and args.get("order_id") == self.change.order_id
        ]
        if writes and not self._done.is_set():
            self._done.set()
            update_order(self.endpoints, self.change.order_id, **self.change.fields)
        return decision
