"""The compact checkpoint layout: one row per checkpoint, holding what changed since its parent
and the writes of the superstep that made it.

LangGraph's own layout writes, at every checkpoint, the version of every channel and what every
node has seen (some 1.2 KB for a state of twenty channels, whatever changed), and a superstep's
writes twice: as pending writes of the checkpoint before it, and as the channel values of the
checkpoint after it. A run's tool step is four checkpoints, so most of what it stored was
bookkeeping that the rows before it already held. Here a row (`Row`) holds:

* the checkpoint's changes against its parent: the channels whose version changed (with their
  new value, or a pointer to the write that is that value), the channels removed, the nodes
  whose seen versions changed, the metadata keys that differ from what its parent predicts
  (the step one on, each delta channel's counters advanced);
* the superstep's writes (the parent's pending writes, which LangGraph hands over with the
  checkpoint: `checkpoints.fenced`), each once.

Names are written as indexes into the parent's sorted channels and nodes, a version of a node's
trigger as "the version its parent had". Every `KEY_EVERY` rows, and whenever the parent is not
known, the row is a keyframe: the whole checkpoint, so a reader rebuilds any checkpoint from at
most that many rows (`Frame.apply`, oldest first from a keyframe). Nothing in a row depends on
a prediction being right: a value that differs from it is written out.

A `Frame` is a checkpoint as rebuilt from its rows, its channel values still serialized (the
serde's typed bytes): decoding a value is left to whoever needs it. The format is versioned by
the first byte of the body: `FORMAT`, the msgpack as it is, or `COMPRESSED`, deflated, which a
row is whenever that makes it shorter. A row is written once and read seldom, and what it holds
is mostly text (observations, messages, ids): deflated, a tool step's rows are about a third
shorter on the wire, in the WAL and on disk, and an observation of a few KB stays in its row
where Postgres would move it out of line (TOAST: a row of its own in another table, and that
table's index). See `checkpoints.compact` for the tables and the saver.
"""

from __future__ import annotations

import re
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import ormsgpack
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

FORMAT = 1
COMPRESSED = 2
# Deflate's fastest level, in 72 KB of state (a 16 KB window, small hash tables): rows are about
# 1 KB and a node commit waits for its row, and zlib's default 256 KB cost more to set up than
# such a row takes to deflate (a 1 KB row: 7 us against 33, the same bytes; a 12 KB keyframe 1%
# more bytes). A row deflated with any window inflates with the default one.
COMPRESS_LEVEL = 1
COMPRESS_WBITS = 14
COMPRESS_MEM_LEVEL = 4
# A keyframe at least every this many rows of a chain: a reader rebuilds a checkpoint from its
# keyframe on, so this bounds a read (rows are about 1 KB), and a keyframe is the whole state
# (about 3 KB for the reference agent), so it costs each row 1/KEY_EVERY of that.
KEY_EVERY = 64

Version = str | int | float
Stored = tuple[str, bytes]  # a value as the serde's dumps_typed makes it
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The serde's type names, written as their index (any other name is written out).
_TYPES = ("msgpack", "null", "empty", "bytes", "json", "pickle", "bytearray")
# A value a parent frame has, its bytes not kept (`Frame.as_parent`).
_KEPT_ELSEWHERE: Stored = ("", b"")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Write:
    """One pending write, its value serialized."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    value: Stored
    # The object serialized, while the writer has it: a channel value that is this very
    # object is stored as a pointer to the write without serializing it again.
    source: Any = field(default=None, compare=False, repr=False)

    def pending(self, serde: SerializerProtocol) -> PendingWrite:
        return (self.task_id, self.channel, serde.loads_typed(self.value))

    @property
    def sort_key(self) -> tuple[str, str, int]:
        return writes_sort_key(self.task_path, self.task_id, self.idx)


def task_writes(
    task_id: str, task_path: str, writes: Sequence[tuple[str, Any]], serde: SerializerProtocol
) -> list[Write]:
    """A task's writes as the stock savers number them: an ordinary write by its position, a
    special one (an error, an interrupt, a resume value) by its fixed negative index."""
    return [
        Write(
            task_id,
            task_path,
            WRITES_IDX_MAP.get(channel, i),
            channel,
            serde.dumps_typed(value),
            value,
        )
        for i, (channel, value) in enumerate(writes)
    ]


@dataclass(frozen=True)
class Row:
    """A stored checkpoint: its key, its parent's, whether it is a keyframe, and its body."""

    checkpoint_id: str
    parent_id: str | None
    key: bool
    body: bytes


@dataclass
class Frame:
    """A checkpoint rebuilt from its rows (or about to be written as one)."""

    checkpoint_id: str
    parent_id: str | None
    v: int
    ts: str
    versions: dict[str, Version]
    values: dict[str, Stored]  # a channel with no stored value at its version is absent
    seen: dict[str, dict[str, Version]]
    updated: list[str] | None
    metadata: dict[str, Any]
    since_key: int  # rows since the chain's last keyframe: 0 for a keyframe
    writes: list[Write] = field(default_factory=list)  # of the superstep that made it
    _channels: list[str] | None = field(default=None, repr=False)
    _nodes: list[str] | None = field(default=None, repr=False)
    _channel_at: dict[str, int] | None = field(default=None, repr=False)
    _node_at: dict[str, int] | None = field(default=None, repr=False)

    @property
    def channels(self) -> list[str]:
        """Its channels, sorted: a child row names a channel by its index here."""
        if self._channels is None:
            self._channels = sorted(self.versions)
        return self._channels

    @property
    def nodes(self) -> list[str]:
        if self._nodes is None:
            self._nodes = sorted(self.seen)
        return self._nodes

    def channel_at(self, channel: str) -> int:
        """The index of one of its channels in `channels`."""
        if self._channel_at is None:
            self._channel_at = {name: i for i, name in enumerate(self.channels)}
        return self._channel_at[channel]

    def node_at(self, node: str) -> int:
        if self._node_at is None:
            self._node_at = {name: i for i, name in enumerate(self.nodes)}
        return self._node_at[node]

    def as_parent(self) -> Frame:
        """What a writer keeps of it for its child's row: its values' bytes and its writes
        let go (the child needs to know which channels have a value, not the value: an agent's
        state may be large, and a worker remembers the last checkpoint of many runs)."""
        return replace(self, values=dict.fromkeys(self.values, _KEPT_ELSEWHERE), writes=[])

    def checkpoint(self, serde: SerializerProtocol) -> Checkpoint:
        """The checkpoint, its values decoded."""
        return Checkpoint(
            v=self.v,
            id=self.checkpoint_id,
            ts=self.ts,
            channel_values={k: serde.loads_typed(v) for k, v in self.values.items()},
            channel_versions=dict(self.versions),
            versions_seen={node: dict(seen) for node, seen in self.seen.items()},
            updated_channels=None if self.updated is None else list(self.updated),
        )

    @classmethod
    def apply(cls, parent: Frame | None, row: Row) -> Frame:
        """The checkpoint `row` stores, given the one its parent stores (None for a keyframe)."""
        body = _body(row)
        if row.key:
            return _Reader(None, body).frame(row)
        if parent is None:
            raise ValueError(f"checkpoint {row.checkpoint_id}: its parent row is missing")
        return _Reader(parent, body).frame(row)


def rebuild(rows: Sequence[Row]) -> list[Frame]:
    """The frames of a chain of rows given newest first, ending at a keyframe: oldest first."""
    frames: list[Frame] = []
    for row in reversed(rows):
        frames.append(Frame.apply(frames[-1] if frames else None, row))
    return frames


@dataclass(frozen=True)
class Step:
    """What a row says of the superstep that made it, read with nothing but the names of the
    channels before it: its writes, the channels it set (with the value stored at their new
    version, None for none) and those it removed. What a DeltaChannel's history needs (the
    writes since a stored value), without rebuilding every checkpoint of a chain."""

    row: Row
    writes: list[Write]
    set: dict[str, Stored | None]
    removed: frozenset[str]


def steps(rows: Iterable[Row]) -> list[Step]:
    """The steps of a chain of rows given oldest first, from a keyframe."""
    names: list[str] = []  # the channels before the row, sorted: what its indexes refer to
    out: list[Step] = []
    for row in rows:
        body = _body(row)
        if not row.key and not out:
            raise ValueError(f"checkpoint {row.checkpoint_id}: its parent row is missing")
        before = names

        def name(ref: int | str, before: list[str] = before) -> str:
            return ref if isinstance(ref, str) else before[ref]

        set_here = [name(ref) for ref, _, _ in body["C"]]
        writes = _writes(body, set_here)
        stored = {
            channel: _stored(value, writes)
            for channel, (_, _, value) in zip(set_here, body["C"], strict=True)
        }
        removed = frozenset(name(ref) for ref in body.get("R", ()))
        channels = set(set_here) if row.key else (set(before) - removed) | set(set_here)
        names = sorted(channels)
        out.append(Step(row, writes, stored, removed))
    return out


def _body(row: Row) -> dict[str, Any]:
    body: dict[str, Any] = ormsgpack.unpackb(packed(row.body, row.checkpoint_id))
    return body


def packed(body: bytes, checkpoint_id: str = "") -> bytes:
    """A row's body as msgpack, inflated if it was stored deflated."""
    kind = body[:1]
    if kind == bytes((FORMAT,)):
        return body[1:]
    if kind == bytes((COMPRESSED,)):
        return zlib.decompress(body[1:])
    raise ValueError(f"checkpoint {checkpoint_id}: unknown row format {kind!r}")


def _stored_body(packed_body: bytes) -> bytes:
    """The body a row stores: the msgpack deflated if that is shorter, else as it is."""
    deflater = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, COMPRESS_WBITS, COMPRESS_MEM_LEVEL)
    deflated = deflater.compress(packed_body) + deflater.flush()
    if len(deflated) < len(packed_body):
        return bytes((COMPRESSED,)) + deflated
    return bytes((FORMAT,)) + packed_body


def _writes(body: Mapping[str, Any], set_here: list[str]) -> list[Write]:
    """W's writes; a channel is named by its index in C (`set_here`) where C has it."""
    out: list[Write] = []
    for task, path, entries in body.get("W", ()):
        task_id = _task_text(task)
        for position, (channel, code, data, *idx) in enumerate(entries):
            out.append(
                Write(
                    task_id,
                    path,
                    idx[0] if idx else position,
                    channel if isinstance(channel, str) else set_here[channel],
                    (_type_name(code), data),
                )
            )
    return out


def _stored(code: Any, writes: Sequence[Write]) -> Stored | None:
    """A value of C: none, the write it is, or its own [type, bytes]."""
    if code is None:
        return None
    if isinstance(code, int):
        return writes[code].value
    return (_type_name(code[0]), code[1])


def stored_at(body: bytes) -> datetime:
    """When a row's checkpoint was made (its `ts`), which every row holds whole: read without
    rebuilding the chain (the benchmarks time a run by its checkpoints)."""
    return datetime.fromisoformat(_ts_text(ormsgpack.unpackb(packed(body))["t"]))


def encode(
    parent: Frame | None,
    checkpoint_id: str,
    parent_id: str | None,
    checkpoint: Checkpoint,
    metadata: Mapping[str, Any],
    new_versions: ChannelVersions,
    writes: Sequence[Write],
    serde: SerializerProtocol,
) -> tuple[Row, Frame]:
    """The row that stores `checkpoint` after `parent` (a keyframe if None), with the writes of
    the superstep that made it; and the frame a reader will rebuild from it."""
    frame = Frame(
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        v=int(checkpoint["v"]),
        ts=str(checkpoint["ts"]),
        versions=dict(checkpoint["channel_versions"]),
        values={},
        seen={node: dict(seen) for node, seen in checkpoint["versions_seen"].items()},
        updated=_updated(checkpoint),
        metadata=plain_metadata(metadata),
        since_key=0 if parent is None else parent.since_key + 1,
        writes=_by_task(writes),
    )
    return _Writer(parent, frame, checkpoint, new_versions, serde).row(), frame


def _by_task(writes: Sequence[Write]) -> list[Write]:
    """The writes with each task's together, each task where it first appears (as in W)."""
    tasks: dict[tuple[str, str], list[Write]] = {}
    for write in writes:
        tasks.setdefault((write.task_id, write.task_path), []).append(write)
    return [write for group in tasks.values() for write in group]


def _updated(checkpoint: Checkpoint) -> list[str] | None:
    updated = checkpoint.get("updated_channels")
    return None if updated is None else list(updated)


def plain_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` as a JSON store gives it back (a tuple as a list), a copy of its own: it is
    compared with its parent's, read back as the stock savers read it, and handed to a caller
    who may change it without changing the frame a saver remembers."""
    plain: dict[str, Any] = ormsgpack.unpackb(ormsgpack.packb(metadata))
    return plain


def predicted_metadata(parent: Mapping[str, Any], updated: Iterable[str] | None) -> dict[str, Any]:
    """What a checkpoint's metadata most likely is, given its parent's: LangGraph's loop moves
    the step on by one, and each delta channel's counters (updates, supersteps) by (1 if it was
    updated else 0, 1). A row stores only where the metadata differs from this."""
    out = dict(parent)
    step = out.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        out["step"] = step + 1
    counters = out.get("counters_since_delta_snapshot")
    if isinstance(counters, dict):
        changed = set(updated or ())
        out["counters_since_delta_snapshot"] = {
            channel: [pair[0] + (channel in changed), pair[1] + 1] if _is_pair(pair) else pair
            for channel, pair in counters.items()
        }
    return out


def _same(a: Version, b: Version) -> bool:
    """The same version, of the same type: 1, 1.0 and True are equal in Python, and a row that
    left one out as unchanged would give back its parent's."""
    return a == b and type(a) is type(b)


def _same_versions(a: Mapping[str, Version], b: Mapping[str, Version]) -> bool:
    # The types compared in C (`map`): this runs for every node at every commit.
    return a == b and list(map(type, a.values())) == list(map(type, map(b.__getitem__, a)))


def _same_value(a: Any, b: Any) -> bool:
    """The same metadata value: its encoding tells 1, 1.0 and True apart, in a list or dict too
    (where it also tells a dict with its keys in another sequence apart, which only costs the
    row those few bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (dict, list)):
        return a is b or ormsgpack.packb(a) == ormsgpack.packb(b)
    return bool(a == b)


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, list) and len(value) == 2 and _is_count(value[0]) and _is_count(value[1])
    )


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)


def _type_code(name: str) -> int | str:
    return _TYPES.index(name) if name in _TYPES else name


def _type_name(code: int | str) -> str:
    return _TYPES[code] if isinstance(code, int) else code


def _ts_code(ts: str) -> int | str:
    """A UTC ISO timestamp as microseconds since the epoch, if it reads back the same."""
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        return ts
    if moment.utcoffset() != timedelta(0):
        return ts
    micros = (moment - _EPOCH) // timedelta(microseconds=1)
    return micros if _ts_text(micros) == ts else ts


def _ts_text(code: int | str) -> str:
    return code if isinstance(code, str) else (_EPOCH + timedelta(microseconds=code)).isoformat()


def _task_code(task_id: str) -> bytes | str:
    """A task id as its 16 bytes, if it is a UUID that reads back the same (`_task_text`: the
    canonical spelling, lower-case hex in groups of 8-4-4-4-12)."""
    if _CANONICAL_UUID.fullmatch(task_id) is None:
        return task_id
    return bytes.fromhex(task_id.replace("-", ""))


def _task_text(code: bytes | str) -> str:
    return str(uuid.UUID(bytes=code)) if isinstance(code, bytes) else code


class _Writer:
    """Builds one row's body. Keys: t the timestamp, v the checkpoint's format (where it
    differs from the parent's), N the versions the row names, C the channels it sets [name,
    version, value], R the channels removed, U the updated channels, S the nodes whose seen
    versions changed, M and D the metadata (keys that differ from the prediction, keys it
    lacks), W the writes [task, path, [[channel, type, bytes, (idx)]]]. A value is None (none
    stored at that version), the index of the write it is (counted through W), or [type, bytes]."""

    def __init__(
        self,
        parent: Frame | None,
        frame: Frame,
        checkpoint: Checkpoint,
        new_versions: ChannelVersions,
        serde: SerializerProtocol,
    ) -> None:
        self.parent = parent
        self.frame = frame
        self.values = checkpoint["channel_values"]
        self.new_versions = new_versions
        self.serde = serde
        self.versions: list[Version] = []
        self.set_here: dict[str, int] = {}  # channel -> its index in C
        self.writes_to: dict[str, list[int]] = {}  # channel -> the indexes of its writes
        for i, write in enumerate(frame.writes):
            self.writes_to.setdefault(write.channel, []).append(i)

    def row(self) -> Row:
        frame, parent = self.frame, self.parent
        body: dict[str, Any] = {"t": _ts_code(frame.ts)}
        if parent is None or parent.v != frame.v:
            body["v"] = frame.v
        if parent is not None:
            frame.values = {k: v for k, v in parent.values.items() if k in frame.versions}
            if removed := [self._name(c) for c in parent.versions if c not in frame.versions]:
                body["R"] = removed
        body["C"] = [self._set(name) for name in self._set_channels()]
        if frame.updated is not None:
            body["U"] = [self.set_here.get(c, c) for c in frame.updated]
        if seen := self._seen():
            body["S"] = seen
        self._metadata(body)
        if frame.writes:
            body["W"] = self._writes()
        body["N"] = self.versions
        return Row(
            frame.checkpoint_id,
            frame.parent_id,
            parent is None,
            _stored_body(ormsgpack.packb(body)),
        )

    def _set_channels(self) -> list[str]:
        """The channels whose version and value this row sets: every one in a keyframe, else
        the new ones, those whose version changed, and those whose value came or went under
        the same version. (A value that changed under the same version keeps its parent's, as
        a blob keyed by its version does in LangGraph's layout: LangGraph moves the version.)"""
        versions, parent = self.frame.versions, self.parent
        if parent is None:
            return list(versions)
        had, has = parent.values, self.values
        return [
            c
            for c, v in versions.items()
            if c in self.new_versions
            or c not in parent.versions
            or not _same(parent.versions[c], v)
            or (c in had) != (c in has)
        ]

    def _set(self, name: str) -> list[Any]:
        """C's entry for `name`: its version, and the value it has at it."""
        self.set_here[name] = len(self.set_here)
        entry = [self._name(name), self._version(self.frame.versions[name])]
        if name not in self.values:
            self.frame.values.pop(name, None)
            return [*entry, None]
        stored, code = self._value(name, self.values[name])
        self.frame.values[name] = stored
        return [*entry, code]

    def _value(self, name: str, value: Any) -> tuple[Stored, int | list[Any]]:
        """`value`, stored as the write it is if one of the row's writes to `name` is it (a
        channel that keeps the last value written), else as its own bytes."""
        writes = self.frame.writes
        candidates = self.writes_to.get(name, ())
        for i in candidates:
            if writes[i].source is value:
                return writes[i].value, i
        stored = self.serde.dumps_typed(value)
        for i in candidates:
            if writes[i].value == stored:
                return writes[i].value, i
        return stored, [_type_code(stored[0]), stored[1]]

    def _name(self, channel: str) -> int | str:
        """A channel's name, as its index among the parent's channels where it has it."""
        parent = self.parent
        if parent is not None and channel in parent.versions:
            return parent.channel_at(channel)
        return channel

    def _version(self, version: Version) -> int:
        for i, known in enumerate(self.versions):
            if _same(known, version):
                return i
        self.versions.append(version)
        return len(self.versions) - 1

    def _seen(self) -> list[Any]:
        frame, parent = self.frame, self.parent
        old = parent.seen if parent is not None else {}
        out: list[Any] = [
            [self._node(node), [self._seen_entry(c, v) for c, v in seen.items()]]
            for node, seen in frame.seen.items()
            if node not in old or not _same_versions(old[node], seen)
        ]
        out.extend([self._node(node), None] for node in old if node not in frame.seen)
        return out

    def _node(self, node: str) -> int | str:
        parent = self.parent
        if parent is not None and node in parent.seen:
            return parent.node_at(node)
        return node

    def _seen_entry(self, channel: str, version: Version) -> list[Any]:
        """A seen version: True if it is the one the parent's channel has (a node records the
        version of its trigger it ran on), else the version's index in N."""
        parent = self.parent
        if parent is not None and channel in parent.versions:
            same = _same(parent.versions[channel], version)
            return [parent.channel_at(channel), True if same else self._version(version)]
        return [channel, self._version(version)]

    def _metadata(self, body: dict[str, Any]) -> None:
        parent, frame = self.parent, self.frame
        expected = predicted_metadata(parent.metadata, frame.updated) if parent else {}
        actual = frame.metadata
        if ormsgpack.packb(actual) == ormsgpack.packb(expected):
            return  # as predicted, key for key and type for type (in a run: always)
        if changed := {
            k: v for k, v in actual.items() if k not in expected or not _same_value(expected[k], v)
        }:
            body["M"] = changed
        if removed := [k for k in expected if k not in actual]:
            body["D"] = removed

    def _writes(self) -> list[Any]:
        """W: the writes grouped by task, as the frame lists them (`encode` groups them)."""
        tasks: dict[tuple[str, str], list[Any]] = {}
        for write in self.frame.writes:
            entries = tasks.setdefault((write.task_id, write.task_path), [])
            channel = self.set_here.get(write.channel, write.channel)
            entry = [channel, _type_code(write.value[0]), write.value[1]]
            if write.idx != len(entries):
                entry.append(write.idx)
            entries.append(entry)
        return [[_task_code(task), path, entries] for (task, path), entries in tasks.items()]


class _Reader:
    """Rebuilds the frame a row's body stores, on its parent's (None: the body is a keyframe)."""

    def __init__(self, parent: Frame | None, body: dict[str, Any]) -> None:
        self.parent = parent
        self.body = body
        self.versions: list[Version] = body["N"]

    def frame(self, row: Row) -> Frame:
        body, parent = self.body, self.parent
        set_here = [self._name(ref) for ref, _, _ in body["C"]]
        writes = _writes(body, set_here)
        versions = dict(parent.versions) if parent else {}
        values = dict(parent.values) if parent else {}
        for ref in body.get("R", ()):
            name = self._name(ref)
            versions.pop(name, None)
            values.pop(name, None)
        for name, (_, version, value) in zip(set_here, body["C"], strict=True):
            versions[name] = self.versions[version]
            stored = _stored(value, writes)
            if stored is None:
                values.pop(name, None)
            else:
                values[name] = stored
        updated = body.get("U")
        if updated is not None:
            updated = [set_here[u] if isinstance(u, int) else u for u in updated]
        frame = Frame(
            checkpoint_id=row.checkpoint_id,
            parent_id=row.parent_id,
            v=body.get("v", parent.v if parent else 1),
            ts=_ts_text(body["t"]),
            versions=versions,
            values=values,
            seen=self._seen(),
            updated=updated,
            metadata={},
            since_key=parent.since_key + 1 if parent else 0,
            writes=writes,
        )
        expected = predicted_metadata(parent.metadata, updated) if parent else {}
        for key in body.get("D", ()):
            expected.pop(key, None)
        frame.metadata = {**expected, **body.get("M", {})}
        return frame

    def _name(self, ref: int | str) -> str:
        if isinstance(ref, int):
            assert self.parent is not None, "a keyframe names its channels"
            return self.parent.channels[ref]
        return ref

    def _seen(self) -> dict[str, dict[str, Version]]:
        parent = self.parent
        seen = dict(parent.seen) if parent else {}
        for ref, entries in self.body.get("S", ()):
            node = ref if isinstance(ref, str) else self._node(ref)
            if entries is None:
                seen.pop(node, None)
                continue
            seen[node] = {
                self._name(channel): self._seen_version(self._name(channel), version)
                for channel, version in entries
            }
        return seen

    def _node(self, ref: int) -> str:
        assert self.parent is not None, "a keyframe names its nodes"
        return self.parent.nodes[ref]

    def _seen_version(self, channel: str, version: int | bool) -> Version:
        if version is True:
            assert self.parent is not None, "a keyframe writes its versions out"
            return self.parent.versions[channel]
        return self.versions[version]
