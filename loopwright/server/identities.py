"""Who is calling: a bearer token (`Authorization: Bearer ...`) to a `User`, or a refusal.

Two ways to prove an identity, both taken where configured (`server.jwt_identity`: JWTs
signed by the identity provider, for production; `server.bearer_tokens`: a static table, for
development and a few service accounts). A token shaped as a JWT is judged as one; any other
is looked up in the table. Neither configured: nobody is anybody, every request is refused.

The Authorization header is judged before anything else is done with it: at most
`MAX_AUTHORIZATION_BYTES`, ASCII, `Bearer <token>` with a token as RFC 6750 spells it (a
`bearer_tokens.MAX_TOKEN_BYTES` token at most), whether the engine hands it over as bytes or as
text; anything else is a 401 in one line, never decoded, hashed or verified. A JWT's signature
and claims are verified in a small pool of threads of its own, off the event loop: one costly
verification, or many, hold up no other request of the process.

Keys and the table follow their files without a restart. The file checks and key fetches are
blocking I/O, so they run in a thread, and only when due (once a second for a file; for a key
URL see `server.jwks`).

One process-wide `Identities` (`configured()`), built from the environment at the server's
start (a broken configuration stops it there) and asked by the edge (`server.edge`) for every
request that needs an identity.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from loopwright.server.bearer_tokens import (
    MAX_TOKEN_BYTES,
    TOKENS_ENV,
    TOKENS_FILE_ENV,
    TokenTable,
    TokenTableError,
    table_parser,
    token_table,
    well_formed_token,
)
from loopwright.server.jwt_identity import (
    JWKS_ENV,
    JwtRefused,
    JwtSettings,
    JwtVerifier,
    KeysUnavailable,
    looks_like_jwt,
)
from loopwright.server.service_identity import service_user
from loopwright.server.users import User
from loopwright.server.watched_file import WatchedFile

BEARER_REQUIRED = "a valid bearer token is required"
SCHEME = "Bearer "
# The longest Authorization header judged at all: the scheme and the longest token taken. An
# edge that bounds headers before the app sees them bounds this one by it.
MAX_AUTHORIZATION_BYTES = len(SCHEME) + MAX_TOKEN_BYTES
_BEARER = re.compile(r"bearer +([^ ]+)", re.ASCII | re.IGNORECASE)
# Verifications at once: RSA and EC signatures are CPU work, so a few threads are as fast as
# many, and a flood of tokens queues here instead of taking the threads the engine shares.
VERIFYING_THREADS = 4
_verifying = ThreadPoolExecutor(VERIFYING_THREADS, thread_name_prefix="loopwright-jwt")


class IdentityRefused(Exception):
    """No identity for this request: `status` (401; 503 while keys cannot be had) and one line
    saying why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def bearer_token(authorization: str | bytes | None) -> str:
    """The token of an `Authorization: Bearer <token>` header (bytes, or text as a server
    decoded them); IdentityRefused (401, one line) for anything else, judged by its length
    first and its characters next, before anything is decoded, hashed or verified."""
    if not authorization:
        raise IdentityRefused(401, BEARER_REQUIRED)
    if len(authorization) > MAX_AUTHORIZATION_BYTES:
        raise IdentityRefused(401, f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes")
    if not authorization.isascii():
        raise IdentityRefused(401, "the Authorization header is not ASCII")
    text = authorization.decode() if isinstance(authorization, bytes) else authorization
    matched = _BEARER.fullmatch(text.strip(" \t"))
    if matched is None or not well_formed_token(matched[1]):
        raise IdentityRefused(
            401, f"{BEARER_REQUIRED}: the Authorization header is not '{SCHEME}<token>'"
        )
    return matched[1]


class Identities:
    """The identities a server takes, as its environment configures them."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        settings = JwtSettings.from_env(environ)
        self.jwt = JwtVerifier(settings) if settings is not None else None
        self._table_file: WatchedFile[TokenTable] | None = None
        self._table = TokenTable()
        path = environ.get(TOKENS_FILE_ENV)
        if path and not environ.get(TOKENS_ENV):
            try:
                self._table_file = WatchedFile(
                    path, table_parser(environ, path), empty=TokenTable()
                )
            except OSError as exc:
                raise TokenTableError(f"token table file {path}: {exc.strerror}") from None
        else:
            self._table = token_table(environ)

    @property
    def table(self) -> TokenTable:
        return self._table_file.current if self._table_file is not None else self._table

    def user_for_token(self, token: str) -> User:
        """The user `token` names, by what is held now (no I/O); IdentityRefused otherwise."""
        if (service := service_user(token)) is not None:
            return service
        if looks_like_jwt(token) and self.jwt is not None:
            try:
                return self.jwt.verify(token)
            except JwtRefused as exc:
                raise IdentityRefused(401, str(exc)) from None
            except KeysUnavailable as exc:
                raise IdentityRefused(503, str(exc)) from None
        user = self.table.user_for(token)
        if user is None:
            if looks_like_jwt(token):
                raise IdentityRefused(401, f"this server takes no JWTs: {JWKS_ENV} is not set")
            raise IdentityRefused(401, BEARER_REQUIRED)
        return user

    def _due(self, token: str) -> str | None:
        """The JWT's key id if its keys want a refresh first, "" if the table does, else None
        (no I/O). A JWT whose header is refused needs nothing: it is refused as it is."""
        if looks_like_jwt(token) and self.jwt is not None:
            try:
                kid = self.jwt.key_id(token)
            except JwtRefused:
                return None
            return kid if self.jwt.source.due(kid) else None
        return "" if self._table_file is not None and self._table_file.due() else None

    def _refresh(self, due: str) -> None:
        if due and self.jwt is not None:
            self.jwt.source.refresh(due)
        elif self._table_file is not None:
            self._table_file.refresh()

    async def user_for(self, authorization: str | bytes | None) -> User:
        """The user an Authorization header proves; IdentityRefused otherwise."""
        token = bearer_token(authorization)
        if (due := self._due(token)) is not None:
            await asyncio.to_thread(self._refresh, due)
        if looks_like_jwt(token) and self.jwt is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(_verifying, self.user_for_token, token)
        return self.user_for_token(token)


@functools.cache
def configured() -> Identities:
    """The process's identities, from its environment, built once; IdentityConfigError (one
    line) for a configuration it cannot use."""
    return Identities(os.environ)


async def authenticated_user(authorization: str | bytes | None) -> User:
    """The user an Authorization header proves to this server; IdentityRefused otherwise. The
    one way in: every route's identity is asked here by the edge (`server.edge`)."""
    return await configured().user_for(authorization)
