"""How the desk's code talks to its booking system."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from models import Slot

from loopwright import ToolContext, read_json


@dataclass(frozen=True)
class Desk:
    """The agent's dependencies: the booking system's base URL and one HTTP client."""

    url: str
    http: httpx.Client


@contextmanager
def open_desk() -> Iterator[Desk]:
    with httpx.Client() as http:
        yield Desk(os.environ["DESK_URL"], http)


def fetch_slot(ctx: ToolContext[Desk], slot: str) -> Slot:
    url = f"{ctx.deps.url}/slots/{slot}"
    return Slot.model_validate(read_json(ctx.deps.http, url, timeout=ctx.timeout(5.0)))
