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

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loopwright.server.users import IdentityConfigError, User, user_of
from loopwright.server.watched_file import read_text

TOKENS_ENV = "LOOPWRIGHT_TOKENS"
TOKENS_FILE_ENV = "LOOPWRIGHT_TOKENS_FILE"
PLAIN_TOKENS_ENV = "LOOPWRIGHT_DEV_TOKENS"
HASH_PREFIX = "sha256:"
MIN_TOKEN_CHARS = 16
# The longest bearer token taken, JWTs included (an identity provider's, with a few claims, is
# under 2 KB): a longer one is refused before anything is done with it.
MAX_TOKEN_BYTES = 8192
# A bearer token as RFC 6750 spells it (its b64token): every token a header can carry.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*", re.ASCII)
TOKEN_GRAMMAR = f"letters, digits and -._~+/ (then = padding), at most {MAX_TOKEN_BYTES} bytes"


class TokenTableError(IdentityConfigError):
    """The token table cannot be used as it is; the message says which entry and why."""


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


def parse_token_table(raw: str, source: str, *, plain_allowed: bool) -> TokenTable:
    """The table in `raw` (JSON; blank: empty). TokenTableError, one line, for a table that is
    not an object of token -> {"user_id", "roles", "tenant"} entries with each token once and
    each user a real one, or that holds a plain token where none is allowed."""
    try:
        table = json.loads(raw, object_pairs_hook=_no_duplicates) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise TokenTableError(f"{source}: not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise TokenTableError(f"{source}: expected an object of token -> user entries")
    users: dict[bytes, User] = {}
    for key, entry in table.items():
        digest = _digest(key, source, plain_allowed=plain_allowed)
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
    plain = plain_tokens_allowed(env)
    if raw := env.get(TOKENS_ENV):
        return parse_token_table(raw, TOKENS_ENV, plain_allowed=plain)
    if path := env.get(TOKENS_FILE_ENV):
        try:
            text = read_text(path)
        except OSError as exc:
            raise TokenTableError(f"token table file {path}: {exc.strerror}") from None
        return parse_token_table(text, path, plain_allowed=plain)
    return TokenTable()
