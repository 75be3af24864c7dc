"""The compact saver answers every read as LangGraph's own saver does, whatever was written.

Random sequences of what LangGraph asks of a saver (checkpoints on threads and namespaces, a
branch forked from an older checkpoint, writes saved alone, a superstep's writes held for the
checkpoint after it, special writes: errors, interrupts) go to LangGraph's SQLite saver and to
the compact saver; then every checkpoint is read back from both, by id and as the latest, every
thread listed (all of it, by id, before one, a page, by metadata) and, along a line with no
branch, every channel's DeltaChannel history asked for: the answers must be the same. (With a
branch, LangGraph's saver replays at an ancestor the writes of every branch from it, the compact
one those of the branch the target is on; LangGraph snapshots a new branch's delta channels, so
that its replay never reaches them.) The checkpoints follow LangGraph's discipline: a channel's value changes only with its
version (the compact rows, like LangGraph's Postgres blobs, keep a value by its version).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONFIG_KEY_DURABILITY
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, CheckpointTuple
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from langgraph.checkpoint.sqlite import SqliteSaver

from loopwright.checkpoints.compact import CompactSaver
from loopwright.checkpoints.factory import open_checkpointer
from loopwright_refunds.scratch import fresh_database

Draw = Callable[[st.SearchStrategy[Any]], Any]  # hypothesis's data.draw
CHANNELS = ["a", "b", "messages", "branch:to:x"]
NAMESPACES = ["", "child:1"]
values = st.one_of(
    st.none(),
    st.integers(-(2**31), 2**31),
    st.text(max_size=30),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from("xyz"), st.integers(0, 9), max_size=2),
)
metadata_values = st.one_of(st.integers(0, 99), st.text(max_size=6), st.booleans(), st.none())


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def savers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SqliteSaver, CompactSaver]]:
    """LangGraph's SQLite saver (the reference), and the compact saver on each backend."""
    folder = tmp_path_factory.mktemp("layouts")
    stock = SqliteSaver(sqlite3.connect(str(folder / "stock.sqlite3"), check_same_thread=False))
    stock.setup()
    with ExitStack() as stack:
        if request.param == "postgres":
            server = request.getfixturevalue("postgres_server_url")
            url = stack.enter_context(fresh_database(server, prefix="lw_test"))
        else:
            url = f"sqlite:///{Path(folder) / 'compact.sqlite3'}"
        compact = stack.enter_context(open_checkpointer(url))
        assert isinstance(compact, CompactSaver)
        yield stock, compact


class Scenario:
    """What has been written, to both savers alike."""

    def __init__(self, savers: tuple[SqliteSaver, CompactSaver]) -> None:
        self.savers = savers
        self.run = uuid.uuid4().hex[:8]
        # (thread, ns) -> checkpoints written, oldest first
        self.written: dict[tuple[str, str], list[Checkpoint]] = {}
        self.forked: set[tuple[str, str]] = set()

    def both(self, method: str, *args: Any) -> Any:
        return [getattr(saver, method)(*args) for saver in self.savers]

    def put(self, draw: Draw) -> None:
        thread = f"{self.run}-{draw(st.sampled_from(['t1', 't2']))}"
        ns = draw(st.sampled_from(NAMESPACES))
        line = self.written.setdefault((thread, ns), [])
        parent = None
        if line:  # the latest, or an older one: a branch forked from it
            parent = line[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(line))
            if parent is not line[-1]:
                self.forked.add((thread, ns))
        checkpoint = self._next(draw, parent)
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent["id"]
            if draw(st.booleans()):  # the superstep's writes, held for this checkpoint
                held = {**config["configurable"], CONFIG_KEY_DURABILITY: "sync"}
                writes = self._writes(draw, special=False)
                self.both("put_writes", {"configurable": held}, writes, str(uuid.uuid4()), "~p")
        new_versions = {
            c: v
            for c, v in checkpoint["channel_versions"].items()
            if parent is None or parent["channel_versions"].get(c) != v
        }
        metadata = {"source": "loop", "step": len(line), "parents": {}}
        if draw(st.booleans()):
            metadata["custom"] = draw(metadata_values)
        self.both("put", config, checkpoint, metadata, new_versions)
        line.append(checkpoint)

    def writes_alone(self, draw: Draw) -> None:
        if not self.written:
            return
        (thread, ns), line = draw(st.sampled_from(sorted(self.written.items())))
        checkpoint = draw(st.sampled_from(line))
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        writes = self._writes(draw, special=draw(st.booleans()))
        self.both(
            "put_writes", config, writes, str(uuid.uuid4()), draw(st.sampled_from(["", "~q"]))
        )

    def _writes(self, draw: Draw, *, special: bool) -> list[tuple[str, Any]]:
        if special:
            return [(ERROR, "boom")] if draw(st.booleans()) else [(INTERRUPT, {"q": 1})]
        return [(c, draw(values)) for c in draw(st.lists(st.sampled_from(CHANNELS), max_size=3))]

    def _next(self, draw: Draw, parent: Checkpoint | None) -> Checkpoint:
        versions = dict(parent["channel_versions"]) if parent else {}
        channel_values = dict(parent["channel_values"]) if parent else {}
        counter = 1 + max((int(str(v).split(".")[0]) for v in versions.values()), default=0)
        version = f"{counter:010}.{uuid.uuid4().hex[:8]}"
        for channel in draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=3)):
            versions[channel] = version  # a new value has a new version
            if draw(st.integers(0, 3)):
                channel_values[channel] = draw(values)
            else:
                channel_values.pop(channel, None)  # emptied, as an ephemeral channel is
        if versions and not draw(st.integers(0, 4)):
            channel = draw(st.sampled_from(sorted(versions)))
            versions.pop(channel)
            channel_values.pop(channel, None)
        seen = {n: dict(s) for n, s in (parent["versions_seen"] if parent else {}).items()}
        if versions and draw(st.booleans()):
            node = draw(st.sampled_from(["x", "y"]))
            trigger = draw(st.sampled_from(sorted(versions)))
            seen[node] = {trigger: versions[trigger]}
        return Checkpoint(
            v=4,
            id=_next_id(),
            ts=f"2026-12-03T07:{len(versions):02}:09.{uuid.uuid4().int % 10**6:06}+00:00",
            channel_values=channel_values,
            channel_versions=versions,
            versions_seen=seen,
            updated_channels=sorted(c for c, v in versions.items() if v == version) or None,
        )


_ids = iter(range(10**9))


def _next_id() -> str:
    """Checkpoint ids that grow with time, as LangGraph's (uuid6) do."""
    return f"1f1ef000-0000-6000-8000-{next(_ids):012d}"


def answer(item: CheckpointTuple | None) -> Any:
    """What a read says, in a form two savers' answers can be compared in."""
    if item is None:
        return None
    checkpoint = item.checkpoint
    return (
        item.config["configurable"]["checkpoint_id"],
        (item.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
        checkpoint["ts"],
        checkpoint["channel_values"],
        checkpoint["channel_versions"],
        checkpoint["versions_seen"],
        {k: v for k, v in item.metadata.items()},
        item.pending_writes,
    )


def compare(scenario: Scenario, draw: Draw) -> None:
    stock, compact = scenario.savers
    for (thread, ns), line in scenario.written.items():
        base: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        assert answer(compact.get_tuple(base)) == answer(stock.get_tuple(base))
        for checkpoint in line:
            one: RunnableConfig = {
                "configurable": {**base["configurable"], "checkpoint_id": checkpoint["id"]}
            }
            assert answer(compact.get_tuple(one)) == answer(stock.get_tuple(one))
            by_id: RunnableConfig = {
                "configurable": {"thread_id": thread, "checkpoint_id": checkpoint["id"]}
            }
            for listed in (one, by_id):
                assert [answer(t) for t in compact.list(listed)] == [
                    answer(t) for t in stock.list(listed)
                ]
        if (thread, ns) not in scenario.forked:  # see `delta_history`
            for checkpoint in line:
                at: RunnableConfig = {
                    "configurable": {**base["configurable"], "checkpoint_id": checkpoint["id"]}
                }
                ours_delta = compact.get_delta_channel_history(config=at, channels=CHANNELS)
                theirs_delta = stock.get_delta_channel_history(config=at, channels=CHANNELS)
                assert ours_delta == theirs_delta
        whole: RunnableConfig = {"configurable": {"thread_id": thread}}
        before = {"configurable": {"checkpoint_id": draw(st.sampled_from(line))["id"]}}
        limit = draw(st.integers(1, 3))
        # Not None: LangGraph's SQLite saver takes a filter's None for a key's absence, its
        # Postgres saver (`@>`) and the compact one for a None that is there.
        wanted = {"custom": draw(metadata_values.filter(lambda v: v is not None))}
        for kwargs in ({}, {"before": before}, {"limit": limit}, {"filter": wanted}):
            ours = [answer(t) for t in compact.list(whole, **kwargs)]
            theirs = [answer(t) for t in stock.list(whole, **kwargs)]
            assert ours == theirs, kwargs


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_the_compact_saver_answers_every_read_as_langgraphs_saver(
    savers: tuple[BaseCheckpointSaver[Any], CompactSaver], data: st.DataObject
) -> None:
    scenario = Scenario(savers)  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 14))):
        if data.draw(st.integers(0, 3)):
            scenario.put(data.draw)
        else:
            scenario.writes_alone(data.draw)
    compare(scenario, data.draw)
