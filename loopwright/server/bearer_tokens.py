"""A static table of bearer tokens: development, tests, and a few service accounts.

The table maps each token to a user:

    {"sha256:9f86d0...": {"user_id": "a-1", "roles": ["approver"], "tenant": "bank-a"}}

Entries are the SHA-256 of the token (`loopwright tokens new` makes a token and its entry,
`loopwright tokens hash` hashes one you have), so the file is no list of live credentials: a
copy of it, a backup or a diff in review lets nobody in. A plain token as the key (`"dev-u1":
{...}`) is taken only where plain tokens are allowed (`LOOPWRIGHT_DEV_TOKENS=1`, which
`loopwright serve --dev-tokens` sets for the shipped development table): a production table
with one is refused, saying which. An unsalted hash is enough because the tokens are random
(`tokens new`: 32 random bytes); `tokens hash` refuses short ones. A presented token is compared
against every entry in constant time, so how long a refusal takes tells nothing of the table.

Production identities are JWTs (`server.jwt_identity`); this table may sit beside them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopwright.server.users import IdentityConfigError, User, user_of
from loopwright.server.watched_file import read_text

TOKENS_ENV = "LOOPWRIGHT_TOKENS"
TOKENS_FILE_ENV = "LOOPWRIGHT_TOKENS_FILE"
PLAIN_TOKENS_ENV = "LOOPWRIGHT_DEV_TOKENS"
HASH_PREFIX = "sha256:"
# The development table loopwright ships: its tokens are published (in the package and the
# docs), so they are nobody's on a server that others reach.
DEV_TOKENS = Path(__file__).with_name("dev-tokens.json")
# Set (to 1) by `loopwright serve` for servers listening where others reach them: a token table
# that takes a published token is refused whole, at the server's start and at every change of
# its file (fail closed: no token of it is taken until the entry is removed).
PUBLISHED_REFUSED_ENV = "LOOPWRIGHT_REFUSE_PUBLISHED_TOKENS"
MIN_TOKEN_CHARS = 16
# The longest bearer token taken, JWTs included (an identity provider's, with a few claims, is
# under 2 KB): a longer one is refused before anything is done with it.
MAX_TOKEN_BYTES = 8192
# A bearer token as RFC 6750 spells it (its b64token): every token a header can carry.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*", re.ASCII)
TOKEN_GRAMMAR = f"letters, digits and -._~+/ (then = padding), at most {MAX_TOKEN_BYTES} bytes"


class TokenTableError(IdentityConfigError):
    """The token table cannot be used as it is; the message says which entry and why."""


class PublishedTokenTaken(TokenTableError):
    """A table read with published tokens refused takes one (`PUBLISHED_REFUSED_ENV`)."""


@functools.cache
def _published() -> dict[bytes, str]:
    """The published tokens, by their digest."""
    tokens = json.loads(DEV_TOKENS.read_text())
    return {_digest(token, str(DEV_TOKENS), plain_allowed=True): token for token in tokens}


def published_refused(environ: Mapping[str, str]) -> bool:
    return environ.get(PUBLISHED_REFUSED_ENV, "").strip() == "1"


def well_formed_token(token: str) -> bool:
    """Whether `token` is one a bearer header can carry (`TOKEN_GRAMMAR`): no other is anyone's."""
    return len(token) <= MAX_TOKEN_BYTES and _TOKEN.fullmatch(token) is not None


def hash_token(token: str) -> str:
    """The table's key for `token`: "sha256:<hex>"."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


# What every token `new_token` makes begins with: never a "-" (a command line, `loopwright tokens
# hash TOKEN` among them, would take the token for an option: one in 64 random ones begins so),
# and a leaked token is told from other strings by a secret scanner.
TOKEN_PREFIX = "lw_"


def new_token() -> str:
    """A bearer token nobody guesses: 32 random bytes, URL-safe, after `TOKEN_PREFIX`."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hashed_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """`table` with each plain token replaced by its hash (entries already hashed kept)."""
    return {
        key if key.startswith(HASH_PREFIX) else hash_token(key): entry
        for key, entry in table.items()
    }


def plain_tokens_allowed(environ: Mapping[str, str]) -> bool:
    return environ.get(PLAIN_TOKENS_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class TokenTable:
    """Users by their token's SHA-256 digest."""

    users: tuple[tuple[bytes, User], ...] = ()

    def user_for(self, token: str) -> User | None:
        """The user `token` names, or None; every entry compared, in constant time each (as
        bytes: whatever text `token` is, even one no header carries, it is compared)."""
        digest = hashlib.sha256(token.encode(errors="surrogatepass")).digest()
        found = None
        for known, user in self.users:
            if hmac.compare_digest(known, digest):
                found = user
        return found

    def __len__(self) -> int:
        return len(self.users)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise TokenTableError(f"token {key[:4]}... appears twice: which user it is is unclear")
        seen[key] = value
    return seen


def _digest(key: str, source: str, *, plain_allowed: bool) -> bytes:
    if key.startswith(HASH_PREFIX):
        hexdigest = key.removeprefix(HASH_PREFIX)
        if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
            raise TokenTableError(
                f"{source}: entry {key[:12]}...: not a SHA-256 digest (64 lowercase hex digits)"
            )
        return bytes.fromhex(hexdigest)
    if not well_formed_token(key):
        # A bearer header's token is the word after "Bearer ": this one would match nobody.
        raise TokenTableError(
            f"{source}: token {key[:16]!r}: a token is one word of {TOKEN_GRAMMAR}"
        )
    if not plain_allowed:
        raise TokenTableError(
            f"{source}: token {key[:4]}... is stored in plain: store its hash instead"
            f" (loopwright tokens hash), or set {PLAIN_TOKENS_ENV}=1 in development only"
        )
    return hashlib.sha256(key.encode()).digest()


def parse_token_table(
    raw: str, source: str, *, plain_allowed: bool, no_published: bool = False
) -> TokenTable:
    """The table in `raw` (JSON; blank: empty). TokenTableError, one line, for a table that is
    not an object of token -> {"user_id", "roles", "tenant"} entries with each token once and
    each user a real one, or that holds a plain token where none is allowed; with
    `no_published`, PublishedTokenTaken for one that takes a published token, plain or hashed."""
    try:
        table = json.loads(raw, object_pairs_hook=_no_duplicates) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise TokenTableError(f"{source}: not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise TokenTableError(f"{source}: expected an object of token -> user entries")
    users: dict[bytes, User] = {}
    for key, entry in table.items():
        digest = _digest(key, source, plain_allowed=plain_allowed)
        if no_published and (published := _published().get(digest)) is not None:
            raise PublishedTokenTaken(
                f"the token table takes the published development token {published}"
                f" ({source}), which serves a loopback --host only"
            )
        if digest in users:  # a plain token and its own hash
            raise TokenTableError(f"{source}: token {key[:4]}... appears twice (plain and hashed)")
        try:
            users[digest] = user_of(entry)
        except ValueError as exc:
            raise TokenTableError(f"{source}: token {key[:4]}...: {exc}") from None
    return TokenTable(tuple(users.items()))


def token_table(environ: Mapping[str, str] | None = None) -> TokenTable:
    """The token table the environment names (`LOOPWRIGHT_TOKENS`: the JSON itself, or
    `LOOPWRIGHT_TOKENS_FILE`: a path to it), read now; empty if none is."""
    env = os.environ if environ is None else environ
    if raw := env.get(TOKENS_ENV):
        return table_parser(env, TOKENS_ENV)(raw)
    if path := env.get(TOKENS_FILE_ENV):
        try:
            text = read_text(path)
        except OSError as exc:
            raise TokenTableError(f"token table file {path}: {exc.strerror}") from None
        return table_parser(env, path)(text)
    return TokenTable()


def table_parser(environ: Mapping[str, str], source: str) -> Callable[[str], TokenTable]:
    """`parse_token_table` for a table from `source`, as the environment says to read one
    (plain tokens allowed; published ones refused)."""
    plain, refused = plain_tokens_allowed(environ), published_refused(environ)
    return lambda raw: parse_token_table(raw, source, plain_allowed=plain, no_published=refused)
