"""The payments service's fault switch: failures a real payment provider has, on demand.

Tests arm one fault at a time. Each mode reproduces an outcome the runtime must cope with:
an effect that happened but whose answer never arrived, a clean failure, a slow answer, an
asynchronous settlement, and a downstream that cannot be asked about past requests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FaultMode = Literal[
    "none",
    "accept_then_timeout",  # apply and commit, then sleep delay_s before answering
    "fail_before_commit",  # answer 500 without applying anything
    "latency",  # sleep delay_s, then proceed normally
    "processing",  # record the refund as processing; it settles delay_s later, on a read
]


class Fault(BaseModel):
    mode: FaultMode = "none"
    delay_s: float = Field(default=0, ge=0)
    times: int = Field(default=1, ge=1, description="POST /refunds requests left to affect")
    # Persistent, and independent of `mode`: lookups by idempotency key answer 501, as from a
    # downstream that cannot be asked about past requests.
    no_query: bool = False


class FaultSwitch:
    def __init__(self) -> None:
        self.current = Fault()

    def take(self) -> Fault:
        """The fault one POST /refunds suffers; the switch disarms after `times` of them."""
        fault = self.current
        if fault.mode == "none":
            return fault
        remaining = fault.times - 1
        disarmed = Fault(no_query=fault.no_query)
        self.current = fault.model_copy(update={"times": remaining}) if remaining else disarmed
        return fault

    @property
    def blocks_queries(self) -> bool:
        return self.current.no_query
