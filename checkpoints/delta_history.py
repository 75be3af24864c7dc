"""A DeltaChannel's history over a chain of compact rows (`checkpoints.frames`).

A DeltaChannel (the run's history, evidence and journal) stores no value at most checkpoints:
its value at a checkpoint is the last value stored at an ancestor (a snapshot, its `seed`) and
the writes of every ancestor since, oldest first (`BaseCheckpointSaver.
get_delta_channel_history`). An ancestor's writes are those of its child on the way to the
target (the writes of the superstep that made the child, which the child's row carries) and
those saved alone at it.

`ChainHistory` reads a chain back to its root once and indexes each channel's writes along it,
so that the history at any checkpoint of the chain costs what it returns: LangGraph asks for
it at every checkpoint a run's history lists (`get_state_history`), which would otherwise read
and decode the chain once per checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loopwright.checkpoints.frames import Row, Step, Stored, Write, steps


def merged_writes(alone: Sequence[Write], children: Sequence[Sequence[Write]]) -> list[Write]:
    """A checkpoint's pending writes: saved alone at it, and carried by its children's rows
    (where two carry one write, the first saved is kept, as LangGraph's savers keep it), in
    the sequence LangGraph replays them in (`writes_sort_key`)."""
    kept: dict[tuple[str, int], Write] = {}
    for write in [*alone, *(w for child in children for w in child)]:
        kept.setdefault((write.task_id, write.idx), write)
    return sorted(kept.values(), key=lambda w: w.sort_key)


@dataclass(frozen=True)
class _Channel:
    """One channel along the chain: its pending writes, ancestor after ancestor (`offsets[i]`:
    where ancestor i's begin), and where its value was last stored at or before each row."""

    writes: list[Write]
    offsets: list[int]
    stored_at: list[int]  # per row: the nearest row at or before it that stores a value, or -1
    values: dict[int, Stored]


class ChainHistory:
    """A chain of rows back to its root (given newest first) and the writes saved alone at
    its checkpoints."""

    def __init__(self, rows: Sequence[Row], alone: Mapping[str, Sequence[Write]]) -> None:
        self.steps: list[Step] = steps(reversed(rows))
        self.position = {step.row.checkpoint_id: i for i, step in enumerate(self.steps)}
        # Each checkpoint's pending writes: its child's on this chain (the last has none), and
        # those saved alone at it.
        children = [[child.writes] for child in self.steps[1:]] + [[]]
        self.pending = [
            merged_writes(alone.get(step.row.checkpoint_id, []), carried)
            for step, carried in zip(self.steps, children, strict=True)
        ]
        self._channels: dict[str, _Channel] = {}

    def history(self, checkpoint_id: str, channel: str) -> tuple[list[Write], Stored | None]:
        """The channel's writes since its last stored value before `checkpoint_id` (a
        checkpoint of the chain), oldest first, and that value (None if none was stored)."""
        target = self.position[checkpoint_id]
        if target == 0:
            return [], None
        index = self._channel(channel)
        last = target - 1  # the target's parent: its nearest ancestor
        seed = index.stored_at[last]
        start = index.offsets[seed] if seed >= 0 else 0
        return index.writes[start : index.offsets[last + 1]], index.values.get(seed)

    def _channel(self, channel: str) -> _Channel:
        if channel not in self._channels:
            writes: list[Write] = []
            offsets: list[int] = []
            for pending in self.pending:
                offsets.append(len(writes))
                writes.extend(w for w in pending if w.channel == channel)
            offsets.append(len(writes))
            stored_at: list[int] = []
            values: dict[int, Stored] = {}
            value: Stored | None = None
            for i, step in enumerate(self.steps):
                if channel in step.set:
                    value = step.set[channel]
                elif step.row.key or channel in step.removed:
                    value = None  # a keyframe sets every channel there is
                if value is not None:
                    values[i] = value
                stored_at.append(i if value is not None else stored_at[-1] if stored_at else -1)
            self._channels[channel] = _Channel(writes, offsets, stored_at, values)
        return self._channels[channel]
