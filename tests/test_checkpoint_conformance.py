"""LangGraph's checkpoint conformance suite (`langgraph-checkpoint-conformance`) against every
saver loopwright writes with: the fenced sync savers on both backends (their own commit path:
one statement on Postgres, one BEGIN IMMEDIATE on SQLite) and the server's fenced async saver.

The suite drives a saver through its async methods. The sync savers have none (on purpose: no
write path bypasses the fence), so they are driven through `AsyncOverSync`, which calls the
sync method in a worker thread, as LangGraph's own loop calls a sync saver. The suite's writes
carry no durability, so the sync savers save them at once, each in its own commit; the commit
that holds a superstep's writes for its checkpoint is covered by `test_fenced_rows`. The sync
savers run the suite twice: unfenced, and fenced (every write checked against a lease on its
thread, as a worker's writes are: on Postgres the fenced statement is not the unfenced one)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    Capability,
)
from langgraph.checkpoint.conformance.report import CapabilityReport

from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.leases import LeaseStore, open_lease_store
from loopwright.server.checkpointer import checkpointer as server_checkpointer

pytestmark = pytest.mark.timeout(120)

LEASE_TTL_S = 600.0  # outlives the suite: no write of it may meet an expired lease

# What each saver must pass beyond the base capabilities: the run savers prune (on both
# backends: the compact layout's own), the server's saver also deletes runs' checkpoints (a
# rollback) and copies threads.
EXTENDED = {
    "postgres": {Capability.PRUNE},
    "sqlite": {Capability.PRUNE},
    "server": {Capability.PRUNE, Capability.DELETE_FOR_RUNS, Capability.COPY_THREAD},
}


class AsyncOverSync(BaseCheckpointSaver[str]):
    """A sync saver's methods as the async ones the suite calls, each run in a worker thread.

    With `leases`, every write is fenced, as a worker's are: the first write to a thread
    registers a run of that id leased to this adapter, and each write goes with that lease's
    fence (the statement that checks it under the run row's lock is then the one that writes)."""

    def __init__(self, saver: FencedSaver, leases: LeaseStore | None = None) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver
        self.leases = leases
        self._fences: dict[str, Fence] = {}
        self._writing = threading.Lock()  # a write and the fence it goes with

    def _write[R](self, config: RunnableConfig, write: Callable[[], R]) -> R:
        with self._writing:
            if self.leases is not None:
                thread = str(config["configurable"]["thread_id"])
                if thread not in self._fences:
                    _, lease = self.leases.begin(
                        thread, "conformance", LEASE_TTL_S, task="suite", user_id="suite"
                    )
                    assert lease is not None, f"{thread} was registered before"
                    self._fences[thread] = Fence.of(lease)
                self.saver.fence = self._fences[thread]
            return write()

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = functools.partial(self.saver.put, config, checkpoint, metadata, new_versions)
        return await asyncio.to_thread(self._write, config, put)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        put = functools.partial(self.saver.put_writes, config, writes, task_id, task_path)
        await asyncio.to_thread(self._write, config, put)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.saver.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.saver.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.saver.delete_thread, thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.saver.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        return self.saver.get_next_version(current, channel)


async def conformance(name: str, saver: BaseCheckpointSaver[str]) -> CapabilityReport:
    """The suite's report on `saver`, every capability it implements (the wrapped saver's,
    for `AsyncOverSync`) run against it."""
    inner = saver.saver if isinstance(saver, AsyncOverSync) else saver
    skipped = {cap.value for cap in Capability if not _implements(inner, cap)}

    @checkpointer_test(name=name, skip_capabilities=skipped)
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        yield saver

    return await validate(factory)


def _implements(saver: BaseCheckpointSaver[str], cap: Capability) -> bool:
    """Whether `saver` has its own method for `cap` (named as the capability; the sync one for a
    sync saver, the async one otherwise), not the base class's that raises."""
    method = cap.value if isinstance(saver, FencedSaver) else f"a{cap.value}"
    return getattr(type(saver), method) is not getattr(BaseCheckpointSaver, method)


def assert_conforms(report: CapabilityReport, expected: set[Capability]) -> None:
    failures = [
        f"{cap}: {failure}" for cap, result in report.results.items() for failure in result.failures
    ]
    assert failures == [], "\n".join(failures)
    ran = {Capability(cap) for cap, result in report.results.items() if result.passed}
    assert ran == BASE_CAPABILITIES | expected
    assert report.passed_all_base()


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_the_run_savers_pass_langgraphs_checkpoint_conformance_suite(
    database_url: str, fenced: bool
) -> None:
    backend = "postgres" if database_url.startswith("postgres") else "sqlite"
    with open_lease_store(database_url) as leases, open_checkpointer(database_url) as saver:
        adapter = AsyncOverSync(saver, leases if fenced else None)
        report = asyncio.run(conformance(f"loopwright {backend}", adapter))
    assert_conforms(report, EXTENDED[backend])


@pytest.mark.postgres
def test_the_server_saver_passes_langgraphs_checkpoint_conformance_suite(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", postgres_url)

    async def run() -> CapabilityReport:
        async with server_checkpointer() as saver:
            return await conformance("loopwright server", saver)

    assert_conforms(asyncio.run(run()), EXTENDED["server"])
