"""Who committed a checkpoint: the attempt that wrote it names itself in the checkpoint's metadata
(`Writer`), so that whoever reads the run later (`loopwright show`, the retention job keeping a
pruned run's summary) can tell which process did each step and where the run changed hands."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Checkpoint metadata naming who wrote a step (`Writer`).
WRITER_METADATA_KEY = "lw_writer"
FENCE_METADATA_KEY = "lw_fence"
ADVANCE_METADATA_KEY = "lw_advance"
INSTANCE_METADATA_KEY = "lw_instance"
# The agent version whose process wrote a step: which version decided each step of a run that
# changed hands during an upgrade.
VERSION_METADATA_KEY = "lw_version"
# What an attempt was given (`Writer.advance`): a new run, an answer the run waited for, or
# nothing (it resumed the run where it stood).
START, ANSWER, RESUME = "start", "answer", "resume"


@dataclass(frozen=True)
class Writer:
    """Who committed a checkpoint, as its metadata says: the attempt's `owner` (host:pid:nonce)
    and `fence`, what it was given (`advance`: start, answer or resume), the name of the
    process's instance in its deployment (`instance`, e.g. aegra-2) and the agent `version`."""

    owner: str
    fence: int | None = None
    advance: str | None = None
    instance: str | None = None
    version: str | None = None

    def metadata(self) -> dict[str, Any]:
        """The checkpoint metadata that names this writer."""
        stamp = {
            WRITER_METADATA_KEY: self.owner,
            FENCE_METADATA_KEY: self.fence,
            ADVANCE_METADATA_KEY: self.advance,
            INSTANCE_METADATA_KEY: self.instance,
            VERSION_METADATA_KEY: self.version,
        }
        return {key: value for key, value in stamp.items() if value is not None}

    def same_attempt(self, other: Writer) -> bool:
        """Whether `other` names the same attempt: the same owner under the same fence (a new
        claim of the run, even by the same owner, is another attempt)."""
        return (self.owner, self.fence) == (other.owner, other.fence)

    @classmethod
    def of(cls, metadata: Mapping[str, Any] | None) -> Writer | None:
        """The writer a checkpoint's metadata names (None: written before writers were named)."""
        metadata = metadata or {}
        owner = metadata.get(WRITER_METADATA_KEY)
        if not owner:
            return None
        fence = metadata.get(FENCE_METADATA_KEY)
        return cls(
            str(owner),
            fence if isinstance(fence, int) else None,
            _text(metadata.get(ADVANCE_METADATA_KEY)),
            _text(metadata.get(INSTANCE_METADATA_KEY)),
            _text(metadata.get(VERSION_METADATA_KEY)),
        )


def _text(value: Any) -> str | None:
    return str(value) if value else None


def handed_over(metadata: Iterable[Mapping[str, Any] | None]) -> list[Writer]:
    """The writers the metadata of a run's checkpoints name, oldest first, each once from where
    it took the run: a checkpoint by the writer of the one before (the same owner and fence)
    adds none, nor does one written before writers were named."""
    found: list[Writer] = []
    for stamp in metadata:
        writer = Writer.of(stamp)
        if writer is not None and not (found and writer.same_attempt(found[-1])):
            found.append(writer)
    return found
