"""A file's parsed contents that follow the file: read again once it changes on disk.

Identities (token tables, signing keys) change while servers run: a rotated key, a revoked
token. Each instance notices the change by itself, without a restart, by comparing the file's
modification time, size and inode (a replace by rename, as editors and config managers do it,
changes the inode).

A file that goes away, or changes into something that cannot be read or parsed, fails closed:
its contents become `empty` (no identities from it) until it is back and usable, said once in
the log. Keeping the last good copy instead would keep alive whatever the edit revoked: deleting
a token table must revoke its tokens, and an edit that revokes one user but breaks another entry
must not keep the revoked one in. Write such files whole and replace them by rename, so that no
server reads half of one.
"""

from __future__ import annotations

import errno
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


def read_text(path: str | os.PathLike[str]) -> str:
    """The file's text; OSError (with its `strerror`) if it cannot be had as UTF-8 text."""
    data = Path(path).read_bytes()
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise OSError(errno.EILSEQ, f"not UTF-8 text (byte {exc.start})") from None


class WatchedFile[T]:
    """`parse(text)` of the file at `path`: parsed now (its errors raised: a server does not
    start on a file it cannot use), and again by `refresh` whenever the file changed since;
    `empty` while the file is gone or unusable. `due` says whether it is time to look (no I/O:
    an event loop may ask it per request)."""

    def __init__(self, path: str | os.PathLike[str], parse: Callable[[str], T], empty: T) -> None:
        self.path = Path(path)
        self._parse = parse
        self._empty = empty
        self._lock = threading.Lock()
        self._signature: Signature | None = _signature(self.path)
        self.current: T = parse(read_text(self.path))
        self.checked_at = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.checked_at >= CHECK_INTERVAL_S

    def refresh(self) -> T:
        """The contents, read again if the file changed (blocking I/O: call it off the event
        loop); `empty` if it is gone or cannot be used, logged once per change."""
        with self._lock:
            self.checked_at = time.monotonic()
            try:
                signature = _signature(self.path)
            except OSError as exc:
                if self._signature is not None:  # gone since: reported once
                    self._signature = None
                    self._fail(exc.strerror)
                return self.current
            if signature != self._signature:
                self._signature = signature  # a bad version is reported once, not per call
                try:
                    self.current = self._parse(read_text(self.path))
                    log.info("%s changed: read again", self.path)
                except OSError as exc:
                    self._fail(exc.strerror)
                except ValueError as exc:
                    self._fail(str(exc))
            return self.current

    def _fail(self, problem: str | None) -> None:
        self.current = self._empty
        log.error("%s: %s; nothing of it is taken until it is fixed", self.path, problem)
