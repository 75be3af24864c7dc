"""The compact layout's rows give back exactly the checkpoints written into them.

Any chain of checkpoints (channels appearing, changing and going, versions of any type LangGraph
allows, values with and without a write that is them, seen versions, metadata near and far from
what its parent predicts, special writes), each written as a delta on its parent or as a
keyframe, is rebuilt by reading the rows oldest first, types included (1, 1.0 and True are
different versions and different metadata).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import ChannelVersions, Checkpoint
from langgraph.checkpoint.serde.base import maybe_add_typed_methods
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from loopwright.checkpoints.frames import (
    COMPRESSED,
    FORMAT,
    Frame,
    Row,
    Write,
    encode,
    packed,
    predicted_metadata,
    steps,
    task_writes,
)

SERDE = maybe_add_typed_methods(JsonPlusSerializer())
CHANNELS = ["a", "b", "history", "branch:to:x", "__start__", "k" * 40]
NODES = ["x", "y", "__input__", "__start__"]

versions = st.one_of(
    st.text(min_size=1, max_size=22), st.integers(-5, 10**12), st.floats(allow_nan=False)
)
INT64 = st.integers(-(2**63), 2**63 - 1)  # what msgpack, the serde's and the rows', holds
values = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.text(max_size=40),
    st.lists(INT64, max_size=4),
    st.dictionaries(st.text(max_size=5), INT64, max_size=3),
    st.binary(max_size=20),
)
metadata_values = st.one_of(
    st.none(), st.booleans(), INT64, st.floats(allow_nan=False), st.text(max_size=10)
)
timestamps = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.sampled_from(["2026-12-03 07:24:09.553572+00:00", "2026-12-03T07:24:09.000000+00:00"]),
)


@st.composite
def step(draw: st.DrawFn, parent: dict[str, Any]) -> dict[str, Any]:
    """The next checkpoint of a chain: some channels set (a new version and value, or none),
    some removed, some nodes' seen versions changed, metadata advanced or changed."""
    channel_versions = dict(parent["versions"])
    channel_values = dict(parent["values"])
    for channel in draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=4)):
        version, old = draw(versions), channel_versions.get(channel)
        channel_versions[channel] = version
        if draw(st.booleans()):
            channel_values.pop(channel, None)  # its value may come or go under any version
        elif channel not in channel_values or old != version or type(old) is not type(version):
            channel_values[channel] = draw(values)  # a new value has a new version
    for channel in draw(st.lists(st.sampled_from(CHANNELS), unique=True, max_size=2)):
        channel_versions.pop(channel, None)
        channel_values.pop(channel, None)
    seen = {node: dict(v) for node, v in parent["seen"].items()}
    for node in draw(st.lists(st.sampled_from(NODES), unique=True, max_size=2)):
        if draw(st.integers(0, 4)) == 0:
            seen.pop(node, None)
            continue
        choices = [*channel_versions.items(), ("gone", 7)]
        picked = draw(st.lists(st.sampled_from(choices), max_size=3))
        seen[node] = {c: (v if draw(st.booleans()) else draw(versions)) for c, v in picked}
    updated = draw(st.one_of(st.none(), st.lists(st.sampled_from(CHANNELS), max_size=3)))
    metadata = predicted_metadata(parent["metadata"], updated) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(["step", "source", "run_id", "x"]), max_size=2)):
        metadata[key] = draw(metadata_values)
    if draw(st.booleans()):
        counters = {c: [draw(st.integers(0, 3)), draw(st.integers(0, 3))] for c in ("h", "e")}
        metadata["counters_since_delta_snapshot"] = counters
    writes = []
    for task in draw(st.lists(st.sampled_from(["uuid", "plain", "special"]), max_size=3)):
        task_id = str(uuid.uuid4()) if task != "plain" else "task-" + draw(st.text(max_size=4))
        if task == "special":
            pairs = [(ERROR, "boom"), (INTERRUPT, {"q": 1})]
        else:
            pairs = [(c, channel_values.get(c, draw(values))) for c in CHANNELS[:3]]
        writes += task_writes(task_id, draw(st.sampled_from(["", "~p, x"])), pairs, SERDE)
    return {
        "checkpoint": Checkpoint(
            v=draw(st.sampled_from([1, 4])),
            id=str(uuid.uuid4()),
            ts=draw(timestamps),
            channel_values=channel_values,
            channel_versions=channel_versions,
            versions_seen=seen,
            updated_channels=updated,
        ),
        "versions": channel_versions,
        "values": channel_values,
        "seen": seen,
        "metadata": metadata,
        "writes": writes,
        "key": draw(st.integers(0, 5)) == 0,
    }


@st.composite
def chains(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parent: dict[str, Any] = {"versions": {}, "values": {}, "seen": {}, "metadata": {}}
    for _ in range(draw(st.integers(1, 8))):
        parent = draw(step(parent))
        out.append(parent)
    return out


def typed(value: Any) -> Any:
    """A value with the type of every part spelled out, so that 1 and True differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


@settings(max_examples=300, deadline=None)
@given(chains())
def test_a_chain_of_rows_rebuilds_every_checkpoint_written(chain: list[dict[str, Any]]) -> None:
    written: Frame | None = None  # what the writer remembers
    read: Frame | None = None  # what a reader rebuilds from the rows
    rows: list[Row] = []
    frames: list[Frame] = []
    for i, item in enumerate(chain):
        checkpoint: Checkpoint = item["checkpoint"]
        # The writer's parent is what a saver keeps of the last row it wrote.
        parent = None if item["key"] or i == 0 or written is None else written.as_parent()
        row, written = encode(
            parent,
            checkpoint["id"],
            None if i == 0 else chain[i - 1]["checkpoint"]["id"],
            checkpoint,
            item["metadata"],
            {},
            item["writes"],
            SERDE,
        )
        assert row.key == (parent is None)
        read = Frame.apply(None if row.key else read, row)
        rows.append(row)
        frames.append(read)
        assert read.checkpoint_id == checkpoint["id"]
        rebuilt = read.checkpoint(SERDE)
        assert typed(rebuilt["channel_versions"]) == typed(checkpoint["channel_versions"])
        assert typed(rebuilt["versions_seen"]) == typed(checkpoint["versions_seen"])
        assert rebuilt["channel_values"] == checkpoint["channel_values"]
        assert (rebuilt["v"], rebuilt["ts"]) == (checkpoint["v"], checkpoint["ts"])
        assert rebuilt["updated_channels"] == checkpoint["updated_channels"]
        assert typed(read.metadata) == typed(item["metadata"])
        assert [(w.task_id, w.task_path, w.idx, w.channel, w.value) for w in read.writes] == [
            (w.task_id, w.task_path, w.idx, w.channel, w.value) for w in written.writes
        ]
    # Read without the checkpoints (a DeltaChannel's history), the rows say the same.
    for i, step in enumerate(steps(rows)):
        frame = frames[i]
        assert step.writes == frame.writes
        assert {c: v for c, v in step.set.items() if v is not None} == {
            c: frame.values[c] for c in step.set if c in frame.values
        }
        before = set() if rows[i].key else set(frames[i - 1].versions)
        assert step.removed <= before - set(frame.versions)
        assert before - set(frame.versions) - set(step.set) <= step.removed


def checkpoint_of(values: dict[str, Any], versions: ChannelVersions) -> Checkpoint:
    return Checkpoint(
        v=4,
        id="c-1",
        ts="2026-12-03T07:24:09.553572+00:00",
        channel_values=values,
        channel_versions=versions,
        versions_seen={},
        updated_channels=list(values),
    )


def test_a_row_of_an_unknown_format_is_refused() -> None:
    row, _ = encode(None, "c-1", None, checkpoint_of({}, {}), {}, {}, [], SERDE)
    future = Row(row.checkpoint_id, None, True, b"\x03" + row.body[1:])
    with pytest.raises(ValueError, match="unknown row format"):
        Frame.apply(None, future)


def test_a_delta_row_whose_parent_is_missing_is_refused() -> None:
    checkpoint = checkpoint_of({"a": 1}, {"a": "1"})
    first, parent = encode(None, "c-1", None, checkpoint, {}, {}, [], SERDE)
    row, _ = encode(parent, "c-2", "c-1", checkpoint, {}, {"a": "2"}, [], SERDE)
    assert not row.key
    with pytest.raises(ValueError, match="parent row is missing"):
        Frame.apply(None, row)
    with pytest.raises(ValueError, match="parent row is missing"):
        steps([row])
    assert Frame.apply(Frame.apply(None, first), row).values == parent.values


def test_writes_that_are_values_are_stored_once() -> None:
    """A channel whose value is the write that set it (the last value) points at the write."""
    big = "x" * 5_000
    writes: list[Write] = task_writes(str(uuid.uuid4()), "~p, x", [("a", big)], SERDE)
    checkpoint = checkpoint_of({"a": big}, {"a": "1"})
    row, _ = encode(None, "c-1", None, checkpoint, {}, {"a": "1"}, writes, SERDE)
    assert 5_000 < len(packed(row.body)) < 5_200


def test_a_row_is_stored_deflated_where_that_is_shorter_and_read_back_either_way() -> None:
    """Text deflates (a row of it is stored so), random bytes do not (stored as they are); a
    row written before rows were deflated (format 1) reads back the same."""
    text = {"a": "the order was delivered on time; " * 40}
    checkpoint = checkpoint_of(text, {"a": "1"})
    row, _ = encode(None, "c-1", None, checkpoint, {}, {"a": "1"}, [], SERDE)
    assert row.body[0] == COMPRESSED and len(row.body) < len(packed(row.body)) / 4
    noise = {"a": os.urandom(2_000)}
    plain, _ = encode(None, "c-2", None, checkpoint_of(noise, {"a": "1"}), {}, {}, [], SERDE)
    assert plain.body[0] == FORMAT
    before = Row(row.checkpoint_id, None, True, bytes((FORMAT,)) + packed(row.body))
    for stored, values in ((row, text), (plain, noise), (before, text)):
        frame = Frame.apply(None, stored)
        assert frame.checkpoint(SERDE)["channel_values"] == values
