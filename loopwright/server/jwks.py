"""The identity provider's signing keys (a JWKS), from a file or a URL, kept current.

Keys rotate: the provider publishes a new key, signs with it, and later drops the old one. A
file source is read again when the file changes (`server.watched_file`); a key file deleted, or
changed into one that holds no usable key, holds no keys until it is fixed (every token is
refused: a withdrawn key must not live on in a server's copy). A URL source is
fetched at the first token, again once its copy is older than the TTL, and at once when a
token names a key id it does not hold (a key published since), at most once per refetch
interval however many such tokens arrive: a stream of made-up key ids cannot turn the server
into a load on the provider. A fetch that fails keeps the keys held (logged); with none held,
tokens are refused until a fetch succeeds.

Only asymmetric signing keys are taken (RSA, EC, OKP: a verifier holds public keys only, so a
leaked server config lets nobody sign), each with a key id and an algorithm the server allows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from jwt import PyJWK, PyJWTError

from loopwright.core import tls
from loopwright.server.watched_file import WatchedFile

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 5.0
ASYMMETRIC_KEY_TYPES = frozenset({"RSA", "EC", "OKP"})


class JwksError(ValueError):
    """The key set cannot be used; the message says where and why, in one line."""


@dataclass(frozen=True)
class KeySet:
    """Signing keys by key id (`kid`)."""

    keys: Mapping[str, PyJWK] = field(default_factory=dict)


def parse_jwks(text: str, source: str, algorithms: Collection[str]) -> KeySet:
    """The usable signing keys of a JWKS document: asymmetric, with a key id, for an algorithm
    in `algorithms`. JwksError if it is not a JWKS or holds no usable key."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JwksError(f"{source}: not JSON ({exc})") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise JwksError(f'{source}: expected a JWKS, an object with a "keys" list')
    keys: dict[str, PyJWK] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue  # not a key, or one for encryption
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid or entry.get("kty") not in ASYMMETRIC_KEY_TYPES:
            continue
        try:
            key = PyJWK(entry)
        except PyJWTError as exc:
            log.warning("%s: key %s skipped: %s", source, kid, exc)
            continue
        if key.algorithm_name in algorithms:
            keys[kid] = key
    if not keys:
        raise JwksError(
            f"{source}: no usable signing key (an RSA, EC or OKP key with a kid, for one of"
            f" {', '.join(sorted(algorithms))})"
        )
    return KeySet(keys)


class KeySource(Protocol):
    def keys(self) -> KeySet | None:
        """The keys held now (no I/O), or None if none could be had yet."""
        ...

    def due(self, kid: str) -> bool:
        """Whether a token naming `kid` should wait for a `refresh` first (no I/O)."""
        ...

    def refresh(self, kid: str) -> None:
        """Read or fetch the keys again if still due (blocking I/O: off the event loop)."""
        ...


class FileKeys:
    """Keys from a JWKS file, read again once it changes."""

    def __init__(self, path: str, algorithms: Collection[str]) -> None:
        try:
            self._file = WatchedFile(
                path, lambda text: parse_jwks(text, path, algorithms), empty=KeySet()
            )
        except OSError as exc:
            raise JwksError(f"{path}: {exc.strerror}") from None

    def keys(self) -> KeySet:
        return self._file.current

    def due(self, kid: str) -> bool:
        return self._file.due()

    def refresh(self, kid: str) -> None:
        self._file.refresh()


class UrlKeys:
    """Keys fetched from a JWKS URL, cached for `ttl_s`, fetched again on an unknown key id at
    most once per `refetch_s`."""

    def __init__(
        self, url: str, algorithms: Collection[str], *, ttl_s: float, refetch_s: float
    ) -> None:
        self.url = url
        self._algorithms = algorithms
        self._ttl_s = ttl_s
        self._refetch_s = refetch_s
        self._lock = threading.Lock()
        self._held: KeySet | None = None
        self._fetched_at = 0.0  # monotonic time of the last good fetch
        self._tried_at: float | None = None  # of the last attempt, good or not

    def keys(self) -> KeySet | None:
        return self._held

    def due(self, kid: str) -> bool:
        now = time.monotonic()
        if self._tried_at is not None and now - self._tried_at < self._refetch_s:
            return False
        return (
            self._held is None
            or now - self._fetched_at >= self._ttl_s
            or kid not in self._held.keys
        )

    def refresh(self, kid: str) -> None:
        with self._lock:  # one fetch at a time; the ones that waited find it done
            if not self.due(kid):
                return
            self._tried_at = time.monotonic()
            try:
                answer = httpx.get(self.url, timeout=FETCH_TIMEOUT_S, verify=tls.context())
                answer.raise_for_status()
                self._held = parse_jwks(answer.text, self.url, self._algorithms)
                self._fetched_at = time.monotonic()
                log.info("signing keys fetched from %s: %s", self.url, sorted(self._held.keys))
            except (httpx.HTTPError, JwksError) as exc:
                log.error("signing keys from %s: %s; keeping the keys held", self.url, exc)
