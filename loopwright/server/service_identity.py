"""The identity a served process uses to ask its own engine to continue a run.

A run parked in a reconciliation (its write's outcome not known yet, to be asked again at a set
time) is continued by the engine that hosts it, through the engine's own API, so that the
engine's run and thread records say what loopwright's say (`server.waker`). That request needs
an identity no client has: a secret made when the process starts, known to it alone (each
instance wakes the runs through itself), naming the tenant whose run it continues (the engine
keeps each tenant's threads to that tenant's identity). The auth hook lets this identity do one
thing: resume a run parked in a reconciliation (`server.auth`).
"""

from __future__ import annotations

import hmac
import secrets

from loopwright.server.users import SERVICE_ROLE, SERVICE_USER_ID, User

# Where the process reaches its own server, set by the engines' entry points.
SELF_URL_ENV = "LOOPWRIGHT_SELF_URL"
_PREFIX = "lw-service"
_SECRET = secrets.token_urlsafe(32).encode()


def service_token(tenant: str) -> str:
    """The bearer token of this process's service identity in `tenant`."""
    return f"{_PREFIX}.{tenant}.{_SECRET.decode()}"


def service_user(token: str) -> User | None:
    """The service identity `token` proves, if it is this process's; None for any other (any
    text: the secrets are compared as bytes)."""
    prefix, _, rest = token.partition(".")
    tenant, _, secret = rest.rpartition(".")
    given = secret.encode(errors="surrogatepass")
    if prefix != _PREFIX or not tenant or not hmac.compare_digest(given, _SECRET):
        return None
    return User(SERVICE_USER_ID, (SERVICE_ROLE,), tenant)


def is_service(user: User) -> bool:
    """Whether `user` is a served process's own identity: its role, which no token table or
    identity provider grants (`users.user_of` refuses it), is proof enough."""
    return SERVICE_ROLE in user.roles


def self_url(host: str, port: int) -> str:
    """The URL a process reaches its own server at, which listens on `host`:`port`."""
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{'[' + reachable + ']' if ':' in reachable else reachable}:{port}"
