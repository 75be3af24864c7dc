"""Served runs continued by the engine that hosts them when nobody else would: runs parked in a
reconciliation once they are due, and runs the engine stopped advancing.

A served run whose write's outcome is not known yet parks: lw_runs says RECONCILING and when to
look again, and its engine run ends `interrupted`. It must be continued then, and by its engine:
a `loopwright worker` advancing it in its own process would leave the engine's thread
`interrupted` while the run goes on and ends (a worker leaves these runs alone:
`LeaseStore.due`). A run can also be left by its engine on its own: Aegra's reaper marks a run
failed once its worker lease has been lost `BG_JOB_MAX_RETRIES` times (a process killed, or
starved past its heartbeats), and nothing starts it again, though loopwright's run has not
ended. Such a run is stranded once no attempt has held it for `STRANDED_AFTER_S`, longer than
the engine takes to hand a lost run to another instance (`server.cluster`'s settings).

So each served process looks every `POLL_S` for its agent's runs of either kind, each taken by
one process only (`LeaseStore.wake`), and continues each through its own engine's API as the
process's service identity (`server.service_identity`), which may do that and nothing else: a
parked run resumed to look again, a stranded one sent its own task, which from that identity
continues a run from its latest checkpoint and starts none. A wake-up that does not start (the
engine refused it, the process died) is due again after `HOLD_S`. A run that kills every
instance advancing it is not woken for ever: each dead attempt counts in its failure streak,
and the run ends typed at the bound (`loopwright.attempt`).

The process's own URL comes from `LOOPWRIGHT_SELF_URL`, which the entry points of both engines
set (`server.dev`, `server.aegra`); a server started otherwise wakes nothing, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from loopwright.checkpoints.leases import RunRecord
from loopwright.core import tls
from loopwright.core.state import Phase
from loopwright.runner import WAKE_VALUE
from loopwright.server.launch import GRAPH_ID
from loopwright.server.resources import aresources
from loopwright.server.service_identity import SELF_URL_ENV, service_token

log = logging.getLogger(__name__)

POLL_S = 1.0
HOLD_S = 30.0
# How long a served run may go without an attempt holding it (nor a person or a reconciliation
# waited on) before its engine is asked to continue it (`LOOPWRIGHT_STRANDED_AFTER_S`).
STRANDED_AFTER_S = 60.0
STRANDED_AFTER_ENV = "LOOPWRIGHT_STRANDED_AFTER_S"


def stranded_after_s() -> float:
    """`STRANDED_AFTER_S`, or the environment's figure."""
    return float(os.environ.get(STRANDED_AFTER_ENV, STRANDED_AFTER_S))


async def wake_runs(client: httpx.AsyncClient) -> None:
    """Every `POLL_S`, continue the runs to wake through the server `client` speaks to."""
    said = ""  # what the last failure to look was, logged once until it changes
    stranded_s = stranded_after_s()
    while True:
        await asyncio.sleep(POLL_S)
        try:
            res = await aresources()
            runs = await asyncio.to_thread(res.leases.wake, res.agent.name, HOLD_S, stranded_s)
        except Exception as exc:  # the database is down: readiness says so; look again later
            if (why := f"{type(exc).__name__}: {exc}") != said:
                log.warning("parked runs not looked for: %s", why)
            said = why
            continue
        said = ""
        for run in runs:
            await _wake(client, run)


async def _wake(client: httpx.AsyncClient, run: RunRecord) -> None:
    body: dict[str, Any] = {"assistant_id": GRAPH_ID}
    if run.phase == Phase.RECONCILING:
        body["command"] = {"resume": WAKE_VALUE}  # its cue to look again
    else:
        # The engine resumes only a thread it left interrupted: the run's own task, which the
        # service identity sends only to continue a run (`server.inputs.parse_request`).
        log.warning("run %s: its engine stopped advancing it; asking it to go on", run.run_id)
        body["input"] = {"task": run.task}
    headers = {"Authorization": f"Bearer {service_token(run.tenant)}"}
    try:
        answer = await client.post(f"/threads/{run.run_id}/runs", json=body, headers=headers)
    except httpx.HTTPError as exc:
        log.warning("run %s not woken (again in %gs): %s", run.run_id, HOLD_S, exc)
        return
    if answer.status_code >= 400:
        log.warning(
            "run %s not woken (again in %gs): %s %s",
            *(run.run_id, HOLD_S, answer.status_code, answer.text[:200]),
        )


@contextlib.asynccontextmanager
async def waking(_app: Any) -> AsyncIterator[None]:
    """The server app's lifespan: the waker runs for as long as the server does."""
    base_url = os.environ.get(SELF_URL_ENV)
    if not base_url:
        log.warning("%s is not set: parked and stranded runs are not woken", SELF_URL_ENV)
        yield
        return
    async with httpx.AsyncClient(base_url=base_url, timeout=30, verify=tls.context()) as client:
        task = asyncio.create_task(wake_runs(client))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
