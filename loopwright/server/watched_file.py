"""A file's parsed contents that follow the file: read again once it changes on disk.

Identities (token tables, signing keys) change while servers run: a rotated key, a revoked
token. Each instance notices the change by itself, without a restart, by comparing the file's
modification time, size and inode (a replace by rename, as editors and config managers do it,
changes the inode). A change that cannot be parsed (a half-written save) keeps the last good
contents and says why in the log: refusing every caller for a typo would be an outage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# How often a server looks at the file again: a change is in effect this long after it is made.
CHECK_INTERVAL_S = 1.0

type Signature = tuple[int, int, int]


def _signature(path: Path) -> Signature:
    stat = path.stat()
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class WatchedFile[T]:
    """`parse(text)` of the file at `path`: parsed now (its errors raised: a server does not
    start on a file it cannot use), and again by `refresh` whenever the file changed since.
    `due` says whether it is time to look (no I/O: an event loop may ask it per request)."""

    def __init__(self, path: str | os.PathLike[str], parse: Callable[[str], T]) -> None:
        self.path = Path(path)
        self._parse = parse
        self._lock = threading.Lock()
        self._signature = _signature(self.path)
        self.current: T = parse(self.path.read_text())
        self.checked_at = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.checked_at >= CHECK_INTERVAL_S

    def refresh(self) -> T:
        """The contents, read again if the file changed (blocking I/O: call it off the event
        loop). A file gone or unparsable keeps the last good contents, logged."""
        with self._lock:
            self.checked_at = time.monotonic()
            try:
                signature = _signature(self.path)
                if signature != self._signature:
                    self._signature = signature  # a bad version is reported once, not per call
                    self.current = self._parse(self.path.read_text())
                    log.info("%s changed: read again", self.path)
            except (OSError, ValueError) as exc:
                log.error("%s: %s; keeping what it held before", self.path, exc)
            return self.current
