"""LangGraph's checkpoint conformance suite (`langgraph-checkpoint-conformance`) against every
saver loopwright writes with: the fenced sync savers on both backends (their own commit path:
one statement on Postgres, one BEGIN IMMEDIATE on SQLite) and the server's fenced async saver.

The suite drives a saver through its async methods. The sync savers have none (on purpose: no
write path bypasses the fence), so they are driven through `AsyncOverSync`, which calls the
sync method in a worker thread, as LangGraph's own loop calls a sync saver. The suite's writes
carry no durability, so the sync savers save them at once, each in its own commit; the commit
that holds a superstep's writes for its checkpoint is covered by `test_fenced_rows`. Unfenced:
the suite's threads are random ids that no run lease names (the fence is
`test_leases`'s)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
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
from loopwright.checkpoints.fenced import FencedSaver
from loopwright.server.checkpointer import checkpointer as server_checkpointer

pytestmark = pytest.mark.timeout(120)

# What each saver must pass beyond the base capabilities: the sync Postgres saver prunes (the
# retention job's route), the server's saver also deletes runs' checkpoints (a rollback) and
# copies threads. The SQLite saver has none of them.
EXTENDED = {
    "postgres": {Capability.PRUNE},
    "sqlite": set[Capability](),
    "server": {Capability.PRUNE, Capability.DELETE_FOR_RUNS, Capability.COPY_THREAD},
}


class AsyncOverSync(BaseCheckpointSaver[str]):
    """A sync saver's methods as the async ones the suite calls, each run in a worker thread."""

    def __init__(self, saver: FencedSaver) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.saver.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.saver.put_writes, config, writes, task_id, task_path)

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


@pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)
def test_the_run_savers_pass_langgraphs_checkpoint_conformance_suite(
    database_url: str, request: pytest.FixtureRequest
) -> None:
    backend = request.node.callspec.id
    with open_checkpointer(database_url) as saver:
        report = asyncio.run(conformance(f"loopwright {backend}", AsyncOverSync(saver)))
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
