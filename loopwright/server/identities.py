"""Who is calling: a bearer token (`Authorization: Bearer ...`) to a `User`, or a refusal.

Two ways to prove an identity, both taken where configured (`server.jwt_identity`: JWTs
signed by the identity provider, for production; `server.bearer_tokens`: a static table, for
development and a few service accounts). A token shaped as a JWT is judged as one; any other
is looked up in the table. Neither configured: nobody is anybody, every request is refused.

Keys and the table follow their files without a restart. The file checks and key fetches are
blocking I/O, so they run in a thread, and only when due (once a second for a file; for a key
URL see `server.jwks`): the event loop itself only verifies, in memory.

One process-wide `Identities` (`configured()`), built from the environment at the server's
start (a broken configuration stops it there) and shared by the auth hooks and the inbox.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping

from loopwright.server.bearer_tokens import (
    TOKENS_ENV,
    TOKENS_FILE_ENV,
    TokenTable,
    TokenTableError,
    parse_token_table,
    plain_tokens_allowed,
    token_table,
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


class IdentityRefused(Exception):
    """No identity for this request: `status` (401; 503 while keys cannot be had) and one line
    saying why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Identities:
    """The identities a server takes, as its environment configures them."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        settings = JwtSettings.from_env(environ)
        self.jwt = JwtVerifier(settings) if settings is not None else None
        self._table_file: WatchedFile[TokenTable] | None = None
        self._table = TokenTable()
        path = environ.get(TOKENS_FILE_ENV)
        if path and not environ.get(TOKENS_ENV):
            plain = plain_tokens_allowed(environ)
            try:
                self._table_file = WatchedFile(
                    path, lambda text: parse_token_table(text, path, plain_allowed=plain)
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

    async def user_for(self, authorization: str | None) -> User:
        """The user an Authorization header proves; IdentityRefused otherwise."""
        token = bearer_token(authorization)
        if token is None:
            raise IdentityRefused(401, BEARER_REQUIRED)
        if (due := self._due(token)) is not None:
            await asyncio.to_thread(self._refresh, due)
        return self.user_for_token(token)


@functools.cache
def configured() -> Identities:
    """The process's identities, from its environment, built once; IdentityConfigError (one
    line) for a configuration it cannot use."""
    return Identities(os.environ)


async def authenticated_user(authorization: str | None) -> User:
    """The user an Authorization header proves to this server; IdentityRefused otherwise."""
    return await configured().user_for(authorization)
