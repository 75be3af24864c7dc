"""The server's checkpointer (`server.checkpointer`): writes without a lease are fenced out.

The LangGraph server writes through this saver only outside loopwright's runs (state updates,
thread copies, rollbacks, deletes); while a run's lease is live, every such write is refused in
the transaction that would write. Also checks the two methods the server asks custom
checkpointers for, `acopy_thread` and `adelete_for_runs`.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from langgraph.checkpoint.base import CheckpointMetadata, empty_checkpoint

from loopwright.checkpoints.leases import StaleWriter, open_lease_store
from loopwright.server.checkpointer import FencedAsyncPostgresSaver, checkpointer

pytestmark = pytest.mark.postgres


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def put(saver: FencedAsyncPostgresSaver, thread_id: str, run_id: str) -> Any:
    """One checkpoint (with a pending write) on the thread, as written by server run `run_id`."""
    # The server stores the thread id in the metadata too, beyond what the TypedDict declares.
    metadata = {
        "source": "update",
        "step": 0,
        "parents": {},
        "run_id": run_id,
        "thread_id": thread_id,
    }
    stored = await saver.aput(
        config(thread_id), empty_checkpoint(), cast(CheckpointMetadata, metadata), {}
    )
    await saver.aput_writes(stored, [("task", "refund O-42")], task_id="t")
    return stored


async def threads(saver: FencedAsyncPostgresSaver, thread_id: str) -> list[Any]:
    return [c async for c in saver.alist(config(thread_id))]


def test_writes_are_refused_while_a_run_lease_is_live(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", postgres_url)

    async def scenario() -> None:
        async with checkpointer() as saver:
            await put(saver, "t-1", "run-a")
            with open_lease_store(postgres_url) as leases:
                leases.register("t-1", task="refund", user_id="u-1")
                lease = leases.claim("t-1", "worker-1", 30)
                for write in (
                    put(saver, "t-1", "run-b"),
                    saver.acopy_thread("t-2", "t-1"),
                    saver.adelete_for_runs(["run-a"]),
                    saver.adelete_thread("t-1"),
                ):
                    with pytest.raises(StaleWriter):
                        await write
                await put(saver, "t-2", "run-c")  # other threads are not held
                leases.release(lease)
            assert len(await threads(saver, "t-1")) == 1
            await put(saver, "t-1", "run-b")  # released: the server may write again
            assert len(await threads(saver, "t-1")) == 2

    asyncio.run(scenario())


def test_copy_thread_and_delete_for_runs(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", postgres_url)

    async def scenario() -> None:
        async with checkpointer() as saver:
            await put(saver, "t-1", "run-a")
            await put(saver, "t-1", "run-b")
            await saver.acopy_thread("t-1", "t-copy")
            copied = await threads(saver, "t-copy")
            assert len(copied) == 2
            assert {c.metadata["thread_id"] for c in copied} == {"t-copy"}
            assert all(c.pending_writes for c in copied)
            await saver.adelete_for_runs(["run-a"])
            assert [c.metadata["run_id"] for c in await threads(saver, "t-1")] == ["run-b"]
            assert {c.metadata["run_id"] for c in await threads(saver, "t-copy")} == {"run-b"}

    asyncio.run(scenario())
