"""Who a bearer token is (`server.identities`): JWTs verified against the identity provider's
keys (a file or a URL, followed without a restart), the token table stored hashed, and a
refusal in one line for everything else. In-process; `tests/test_served_jwt.py` serves them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loopwright.server.bearer_tokens import (
    DEV_TOKENS,
    MAX_TOKEN_BYTES,
    PUBLISHED_REFUSED_ENV,
    PublishedTokenTaken,
    TokenTableError,
    hash_token,
    hashed_table,
    new_token,
)
from loopwright.server.identities import (
    Identities,
    IdentityRefused,
    authenticated_user,
    configured,
)
from loopwright.server.jwks import KeySet
from loopwright.server.service_identity import is_service, service_token
from loopwright.server.users import SERVICE_ROLE, IdentityConfigError, User
from tests.identity_provider import AUDIENCE, ISSUER, IdentityProvider, SigningKey
from tests.ports import reserved_ports
from tests.runtime_fixtures import cli, wait_for

ANN = User("a-1", ("approver",), "bank-a")


def user_for(identities: Identities, token: str) -> User:
    return asyncio.run(identities.user_for(f"Bearer {token}"))


def refusal(identities: Identities, token: str) -> IdentityRefused:
    with pytest.raises(IdentityRefused) as refused:
        user_for(identities, token)
    assert "\n" not in refused.value.detail
    return refused.value


@pytest.fixture(scope="module")
def provider() -> IdentityProvider:
    return IdentityProvider([SigningKey.new("key-1"), SigningKey.new("key-ec", "ES256")])


@pytest.fixture
def from_file(provider: IdentityProvider, tmp_path: Path) -> Identities:
    return Identities(provider.env(str(provider.write_jwks(tmp_path / "jwks.json"))))


def test_a_jwt_of_the_provider_names_its_user_tenant_and_roles(
    provider: IdentityProvider, from_file: Identities
) -> None:
    assert user_for(from_file, provider.token("a-1", ["approver"], "bank-a")) == ANN
    es256 = provider.token("u-1", ["customer"], key=provider.keys[1])
    assert user_for(from_file, es256) == User("u-1", ("customer",), "default")


@pytest.mark.parametrize(
    ("claims", "why"),
    [
        ({"lifetime_s": -3600}, "the token has expired"),
        ({"nbf": 4_000_000_000}, "the token is not valid yet"),
        ({"iss": "https://other.example.test/"}, "issued by another issuer"),
        ({"aud": "another-service"}, "for another audience"),
        ({"tenant": None}, "the token has no tenant claim"),
        ({"roles": None}, "the token has no roles claim"),
        ({"exp": None, "lifetime_s": 0}, "the token has no exp claim"),
        ({"sub": "u 1"}, "the token's claims name no user here: user_id"),
        # In 2100, not a few minutes after collection: the suite may take longer than that.
        ({"exp": "4102444800"}, "the token's exp is not a number of seconds"),
        ({"nbf": "0"}, "the token's nbf is not a number of seconds"),
        ({"iat": str(int(time.time()))}, "the token's iat is not a number of seconds"),
        ({"iat": True}, "the token's iat is not a number of seconds"),
        ({"lifetime_s": 86_401}, "valid for longer than 86400 s (LOOPWRIGHT_JWT_MAX_LIFETIME_S)"),
        ({"iat": None, "lifetime_s": 90_000}, "valid for longer than 86400 s"),
        ({"iat": time.time() - 90_000}, "valid for longer than 86400 s"),
        ({"sub": "loopwright-service"}, "user_id: 'loopwright-service' is the server's own"),
        ({"sub": "LoopWright-Service"}, "user_id: 'LoopWright-Service' is the server's own"),
    ],
)
def test_a_jwt_refused_says_why_in_one_line(
    provider: IdentityProvider, from_file: Identities, claims: dict[str, object], why: str
) -> None:
    claims = {"user_id": "u-1", "roles": ["customer"], **claims}
    user_id = claims.pop("sub", claims.pop("user_id"))
    token = provider.token(user_id, **claims)  # type: ignore[arg-type]
    refused = refusal(from_file, token)
    assert refused.status == 401 and why in refused.detail


def test_a_jwt_not_signed_by_a_key_of_the_set_is_refused(
    provider: IdentityProvider, from_file: Identities
) -> None:
    impostor = SigningKey.new("key-1")  # the set's key id, another key
    forged = provider.token("a-1", ["approver"], "bank-a", key=impostor)
    assert "signature does not verify" in refusal(from_file, forged).detail
    unknown = provider.token("a-1", ["approver"], "bank-a", key=SigningKey.new("key-9"))
    assert "unknown key (kid 'key-9')" in refusal(from_file, unknown).detail


def test_a_jwt_lives_as_long_as_the_operator_allows(
    provider: IdentityProvider, tmp_path: Path
) -> None:
    env = provider.env(str(provider.write_jwks(tmp_path / "jwks.json")))
    day = provider.token("u-1", ["customer"], lifetime_s=86_400)
    assert user_for(Identities(env), day).user_id == "u-1"
    two_days = provider.token("u-1", ["customer"], lifetime_s=2 * 86_400)
    assert "longer than 86400 s" in refusal(Identities(env), two_days).detail
    longer = Identities(env | {"LOOPWRIGHT_JWT_MAX_LIFETIME_S": str(2 * 86_400)})
    assert user_for(longer, two_days).user_id == "u-1"


def test_a_token_above_the_size_bound_is_refused_before_any_work(
    provider: IdentityProvider, from_file: Identities, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token of a few KB is taken (a JWT with many claims); one longer than MAX_TOKEN_BYTES
    is a 401 saying so, its signature never checked, nothing of it decoded or hashed: a 16 MB
    one costs what a short one does."""
    padded = provider.token("u-1", ["customer"], groups=["g" * 60] * 90)
    assert 6000 < len(padded) <= MAX_TOKEN_BYTES
    assert user_for(from_file, padded).user_id == "u-1"

    def untouched(*args: object, **kwargs: object) -> None:
        raise AssertionError("an oversized token was worked on")

    for name in ("jwt.get_unverified_header", "jwt.decode", "hashlib.sha256", "base64.b64decode"):
        monkeypatch.setattr(name, untouched)
    at_most = len("Bearer ") + MAX_TOKEN_BYTES
    for token in (padded + "A" * (at_most - len(padded)), "eyJ" + "A" * 16_000_000 + ".e.e"):
        refused = refusal(from_file, token)
        assert refused.status == 401
        assert refused.detail == f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes"


@pytest.mark.parametrize(
    "header",
    [
        "Basic dTpw",
        "Bearer",
        "Bearer tok-u1-0123 456789",
        "Bearer\ttok-u1-0123456789",
        "Bearer tok-u1-0123456789,",
        "Bearer tok=u1",
        'Bearer "tok-u1-0123456789"',
        "Bearer: tok-u1-0123456789",
        "Token tok-u1-0123456789",
    ],
)
def test_an_authorization_header_that_is_not_bearer_token_is_a_401_in_one_line(
    header: str,
) -> None:
    table = {"tok-u1-0123456789": {"user_id": "u-1"}}
    identities = Identities({"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))})
    assert asyncio.run(identities.user_for("bearer  tok-u1-0123456789 ")).user_id == "u-1"
    with pytest.raises(IdentityRefused) as refused:
        asyncio.run(identities.user_for(header))
    assert refused.value.status == 401
    assert refused.value.detail == (
        "a valid bearer token is required: the Authorization header is not 'Bearer <token>'"
    )


def test_a_verification_holds_up_no_other_request(
    provider: IdentityProvider, tmp_path: Path
) -> None:
    """While a JWT's verification is held (its keys looked up, and then held there), the same
    event loop proves another identity: the verification runs off the loop."""
    table = {"tok-u2-0123456789": {"user_id": "u-2"}}
    identities = Identities(
        provider.env(str(provider.write_jwks(tmp_path / "jwks.json")))
        | {"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))}
    )
    assert identities.jwt is not None
    source, verifying, released = identities.jwt.source, threading.Event(), threading.Event()

    class HeldKeys:
        def keys(self) -> KeySet | None:
            verifying.set()
            assert released.wait(timeout=60), "the other request never ran"
            return source.keys()

        def due(self, kid: str) -> bool:
            return False

        def refresh(self, kid: str) -> None:
            raise AssertionError("nothing is due")

    identities.jwt.source = HeldKeys()

    async def both() -> tuple[User, User]:
        held = asyncio.create_task(
            identities.user_for(f"Bearer {provider.token('u-1', ['customer'])}")
        )
        assert await asyncio.to_thread(verifying.wait, 60)
        other = await identities.user_for("Bearer tok-u2-0123456789")
        released.set()
        return await held, other

    held, other = asyncio.run(both())
    assert (held.user_id, other.user_id) == ("u-1", "u-2")


# What reaches `authenticated_user`: LangGraph's server hands the headers over as bytes, Aegra
# as text, Starlette (the inbox, the metrics) as text decoded from latin-1; any text at all.
HEADER_VALUES = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=64).map(lambda raw: b"Bearer " + raw),
    st.binary(max_size=64).map(lambda raw: b"Bearer lw-service.t." + raw),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=64),
    st.text(max_size=64).map(lambda text: "Bearer lw-service.default." + text),
)


@pytest.fixture
def served_identities(
    provider: IdentityProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The process's identities (`configured()`, what `authenticated_user` asks): the
    provider's JWTs and a token table."""
    table = {"tok-u1-0123456789": {"user_id": "u-1"}}
    env = provider.env(str(provider.write_jwks(tmp_path / "jwks.json")))
    for name, value in (env | {"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))}).items():
        monkeypatch.setenv(name, value)
    configured.cache_clear()
    yield
    configured.cache_clear()


def refused_whatever_its_bytes(authorization: str | bytes | None) -> None:
    try:
        user = asyncio.run(authenticated_user(authorization))
    except IdentityRefused as exc:
        assert exc.status == 401 and "\n" not in exc.detail
    else:
        raise AssertionError(f"{authorization!r} proved {user}")


async def edge_answer(authorization: bytes) -> tuple[int, str]:
    """What the served edge answers a request for `/info` (any known token's) carrying
    `authorization` as its Authorization header's bytes: its status and body."""
    from loopwright.server.edge import Edge

    async def engine(scope: object, receive: object, send: object) -> None:
        raise AssertionError(f"{authorization!r} passed the edge")

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"x-\xff", b"\xff"), (b"authorization", authorization)]
    scope = {"type": "http", "method": "GET", "path": "/info", "headers": headers}
    await Edge(engine)({**scope, "query_string": b""}, receive, send)  # type: ignore[arg-type]
    return sent[0]["status"], sent[1]["body"].decode()


@pytest.mark.usefixtures("served_identities")
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HEADER_VALUES)
@example(value=b"Bearer \xff")
@example(value="Bearer lw-service.default.\xe9")
@example(value="Bearer lw-service.default.\udcff")
@example(value=b"Bearer tok-u1-0123456789\x80")
def test_bad_bytes_in_the_authorization_header_are_a_401_never_an_error(
    value: str | bytes,
) -> None:
    """As bytes, as text decoded from latin-1 (Starlette's), as any text; and through the
    served edge, which hands `authenticated_user` the header it reads."""
    raw = value if isinstance(value, bytes) else value.encode(errors="surrogatepass")
    refused_whatever_its_bytes(value)
    refused_whatever_its_bytes(raw)
    refused_whatever_its_bytes(raw.decode("latin-1"))
    status, body = asyncio.run(edge_answer(raw))
    assert status == 401 and "\n" not in body, body
    assert asyncio.run(authenticated_user(b"Bearer tok-u1-0123456789")).user_id == "u-1"


@given(token=st.text(st.characters(codec=None, exclude_categories=()), max_size=64))
@example(token="lw-service.default.\udcff")
def test_a_token_of_any_text_is_compared_never_an_error(token: str) -> None:
    """Below the header's checks too: the table and the service identity compare bytes."""
    table = {"tok-u1-0123456789": {"user_id": "u-1"}}
    identities = Identities({"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))})
    with pytest.raises(IdentityRefused):
        identities.user_for_token(token)


def hmac_token(header: dict[str, object], claims: dict[str, object], secret: bytes) -> str:
    def part(value: object) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    signing_input = part(header) + b"." + part({**claims, "roles": ["approver"]})
    signature = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + base64.urlsafe_b64encode(signature).rstrip(b"=")).decode()


def test_none_and_hmac_tokens_are_refused_whatever_their_key(
    provider: IdentityProvider, from_file: Identities
) -> None:
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "a-1", "tenant": "bank-a", "exp": 4e9}
    unsigned = jwt.encode({**claims, "roles": ["approver"]}, "", algorithm="none")
    assert "signed with 'none'" in refusal(from_file, unsigned).detail
    # The classic confusion: the provider's public key (published) used as an HMAC secret
    # (signed by hand: PyJWT itself refuses to sign with a key that looks public).
    public = json.dumps(provider.keys[0].jwk()).encode()
    confused = hmac_token({"alg": "HS256", "typ": "JWT", "kid": "key-1"}, claims, public)
    assert "signed with 'HS256'" in refusal(from_file, confused).detail


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ({"LOOPWRIGHT_JWT_ALGORITHMS": "HS256"}, "HS256 refused"),
        ({"LOOPWRIGHT_JWT_ALGORITHMS": "RS256,none"}, "none refused"),
        ({"LOOPWRIGHT_JWT_AUDIENCE": ""}, "LOOPWRIGHT_JWT_AUDIENCE must be too"),
        ({"LOOPWRIGHT_JWT_LEEWAY_S": "soon"}, "LOOPWRIGHT_JWT_LEEWAY_S=soon: seconds"),
        ({"LOOPWRIGHT_JWKS": "/nowhere/jwks.json"}, "/nowhere/jwks.json: No such file"),
        ({"LOOPWRIGHT_JWT_ALGORITHMS": "ES512"}, "no usable signing key"),
        ({"LOOPWRIGHT_JWT_ISSUER": "  "}, "LOOPWRIGHT_JWT_ISSUER must be too, not blank"),
        ({"LOOPWRIGHT_JWT_ROLES_CLAIM": "realm_access..roles"}, "LOOPWRIGHT_JWT_ROLES_CLAIM: a"),
        ({"LOOPWRIGHT_JWT_ROLES_CLAIM": "realm_access."}, "LOOPWRIGHT_JWT_ROLES_CLAIM: a claim"),
        ({"LOOPWRIGHT_JWT_USER_CLAIM": ".sub"}, "LOOPWRIGHT_JWT_USER_CLAIM: a claim name"),
        ({"LOOPWRIGHT_JWT_TENANT_CLAIM": "org. id"}, "LOOPWRIGHT_JWT_TENANT_CLAIM: a claim"),
        ({"LOOPWRIGHT_JWT_MAX_LIFETIME_S": "forever"}, "LOOPWRIGHT_JWT_MAX_LIFETIME_S=forever"),
    ],
)
def test_identity_settings_that_cannot_be_used_are_refused_at_the_start(
    provider: IdentityProvider, tmp_path: Path, setting: dict[str, str], problem: str
) -> None:
    env = provider.env(str(provider.write_jwks(tmp_path / "jwks.json"))) | setting
    with pytest.raises(IdentityConfigError, match=problem) as refused:
        Identities(env)
    assert "\n" not in str(refused.value)


def test_claim_names_and_leeway_are_the_operators(
    provider: IdentityProvider, tmp_path: Path
) -> None:
    env = provider.env(str(provider.write_jwks(tmp_path / "jwks.json"))) | {
        "LOOPWRIGHT_JWT_USER_CLAIM": "email",
        "LOOPWRIGHT_JWT_TENANT_CLAIM": "org",
        "LOOPWRIGHT_JWT_ROLES_CLAIM": "realm_access.roles",
        "LOOPWRIGHT_JWT_LEEWAY_S": "300",
    }
    identities = Identities(env)
    # Expired a minute ago: inside the leeway. Roles nested, as Keycloak puts them.
    token = provider.token(
        None,
        None,
        None,
        lifetime_s=-60,
        email="ann@bank-a.example",
        org="bank-a",
        realm_access={"roles": ["approver"]},
    )
    assert user_for(identities, token) == User("ann@bank-a.example", ("approver",), "bank-a")
    scoped = provider.token(None, None, None, email="u@x", org="t", realm_access={"roles": "a b"})
    assert user_for(identities, scoped).roles == ("a", "b")  # words, as in OAuth's scope


def test_the_key_file_is_followed_without_a_restart(tmp_path: Path) -> None:
    """A rotation: the new key is published, then the old one withdrawn; one Identities, no
    restart."""
    provider = IdentityProvider()
    old, new = provider.keys[0], SigningKey.new("key-2")
    path = provider.write_jwks(tmp_path / "jwks.json")
    identities = Identities(provider.env(str(path)))
    by_old, by_new = (provider.token("u-1", ["customer"], key=k) for k in (old, new))
    assert user_for(identities, by_old).user_id == "u-1"
    assert "unknown key" in refusal(identities, by_new).detail

    provider.keys = [old, new]
    provider.write_jwks(path)
    wait_for(lambda: accepted(identities, by_new), timeout=30)
    provider.keys = [new]
    provider.write_jwks(path)
    wait_for(lambda: not accepted(identities, by_old), timeout=30)
    assert "unknown key (kid 'key-1')" in refusal(identities, by_old).detail
    assert user_for(identities, by_new).user_id == "u-1"


def accepted(identities: Identities, token: str) -> bool:
    try:
        user_for(identities, token)
    except IdentityRefused:
        return False
    return True


@pytest.fixture
def served_provider() -> Iterator[tuple[IdentityProvider, str]]:
    provider = IdentityProvider()
    with provider.served() as url:
        yield provider, url


def test_keys_from_a_url_are_fetched_once_then_again_for_a_new_key_id(
    served_provider: tuple[IdentityProvider, str],
) -> None:
    provider, url = served_provider
    eager = Identities(provider.env(url) | {"LOOPWRIGHT_JWKS_REFETCH_S": "0"})
    assert provider.fetches == 0  # nothing fetched before a token needs it
    for _ in range(3):
        assert user_for(eager, provider.token("u-1", ["customer"])).user_id == "u-1"
    assert provider.fetches == 1  # cached (TTL 300 s)

    rotated = SigningKey.new("key-2")
    provider.keys.append(rotated)
    assert user_for(eager, provider.token("u-2", ["customer"], key=rotated)).user_id == "u-2"
    assert provider.fetches == 2  # the unknown key id made it fetch the set again


def test_keys_from_a_url_are_fetched_again_once_older_than_their_ttl(
    served_provider: tuple[IdentityProvider, str],
) -> None:
    provider, url = served_provider
    settings = {"LOOPWRIGHT_JWKS_TTL_S": "0", "LOOPWRIGHT_JWKS_REFETCH_S": "0"}
    identities = Identities(provider.env(url) | settings)
    for fetched in (1, 2, 3):
        assert user_for(identities, provider.token("u-1", ["customer"])).user_id == "u-1"
        assert provider.fetches == fetched


def test_unknown_key_ids_refetch_at_most_once_per_interval(
    served_provider: tuple[IdentityProvider, str],
) -> None:
    """A stream of tokens with made-up key ids is no stream of fetches from the provider."""
    provider, url = served_provider
    identities = Identities(provider.env(url) | {"LOOPWRIGHT_JWKS_REFETCH_S": "3600"})
    assert user_for(identities, provider.token("u-1", ["customer"])).user_id == "u-1"
    for n in range(5):
        made_up = provider.token("u-1", ["customer"], key=SigningKey.new(f"made-up-{n}"))
        assert "unknown key" in refusal(identities, made_up).detail
    assert provider.fetches == 1


def test_without_reachable_keys_a_jwt_is_a_503_saying_so(
    served_provider: tuple[IdentityProvider, str],
) -> None:
    provider, url = served_provider
    identities = Identities(provider.env(url.replace("jwks.json", "gone.json")))
    refused = refusal(identities, provider.token("u-1", ["customer"]))
    assert refused.status == 503 and "signing keys could not be fetched" in refused.detail


def test_the_token_table_holds_hashes_and_plain_tokens_only_in_development() -> None:
    table = {"tok-ann-0123456789": {"user_id": "a-1", "roles": ["approver"], "tenant": "bank-a"}}
    hashed = Identities({"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))})
    assert user_for(hashed, "tok-ann-0123456789") == ANN
    assert refusal(hashed, hash_token("tok-ann-0123456789")).status == 401  # the hash is no key
    assert refusal(hashed, "tok-ann-012345678").detail == "a valid bearer token is required"
    with pytest.raises(TokenTableError, match="stored in plain: store its hash instead"):
        Identities({"LOOPWRIGHT_TOKENS": json.dumps(table)})
    development = Identities({"LOOPWRIGHT_TOKENS": json.dumps(table), "LOOPWRIGHT_DEV_TOKENS": "1"})
    assert user_for(development, "tok-ann-0123456789") == ANN
    nobody = Identities({})  # nothing configured: nobody is anybody
    assert refusal(nobody, "tok-ann-0123456789").status == 401


def test_only_the_process_itself_holds_its_service_identity(
    provider: IdentityProvider, from_file: Identities
) -> None:
    """The identity a server wakes its parked runs with (`server.service_identity`): its token
    is the process's own secret; a token table or an identity provider granting its role, or a
    token of its shape with another secret, is refused."""
    table = {"tok-svc-0123456789": {"user_id": "u-9", "roles": [SERVICE_ROLE]}}
    with pytest.raises(TokenTableError, match="loopwright-service"):
        Identities({"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(table))})
    named = {"tok-svc-0123456789": {"user_id": "loopwright-service", "tenant": "bank-a"}}
    with pytest.raises(TokenTableError, match="user_id: 'loopwright-service' is the server's"):
        Identities({"LOOPWRIGHT_TOKENS": json.dumps(hashed_table(named))})
    forged = provider.token("u-9", [SERVICE_ROLE])
    assert refusal(from_file, forged).status == 401
    posing = provider.token("loopwright-service", ["customer"], "bank-a")
    assert "is the server's own" in refusal(from_file, posing).detail
    own = user_for(from_file, service_token("bank-a"))
    assert is_service(own) and own.tenant == "bank-a"
    guessed = service_token("bank-a").rpartition(".")[0] + ".not-the-secret"
    assert refusal(from_file, guessed).status == 401


def test_the_token_table_file_is_followed_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(hashed_table({"tok-u1-0123456789": {"user_id": "u-1"}})))
    identities = Identities({"LOOPWRIGHT_TOKENS_FILE": str(path)})
    assert user_for(identities, "tok-u1-0123456789").user_id == "u-1"
    path.write_text(json.dumps(hashed_table({"tok-u2-0123456789": {"user_id": "u-2"}})))
    wait_for(lambda: accepted(identities, "tok-u2-0123456789"), timeout=30)
    assert not accepted(identities, "tok-u1-0123456789")  # revoked


@pytest.fixture
def checked_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files looked at again on every request (not once a second): each change is in effect
    at the next request."""
    monkeypatch.setattr("loopwright.server.watched_file.CHECK_INTERVAL_S", 0.0)


def file_problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "loopwright.server.watched_file"]


@pytest.mark.usefixtures("checked_every_request")
def test_a_published_token_added_while_serving_off_loopback_lets_nobody_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve` checks the table as a server off loopback starts, and each server checks it
    again at every edit: an entry for a published development token (hashed, as production
    tables are) added while it serves keeps every token of the table out until it is removed.
    On loopback (the setting unset) the same table is taken."""
    caplog.set_level("ERROR", logger="loopwright.server.watched_file")
    own = hashed_table({"tok-u1-0123456789": {"user_id": "u-1"}})
    published = hashed_table({"dev-a1": {"user_id": "a-1", "roles": ["approver"]}})
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(own))
    env = {"LOOPWRIGHT_TOKENS_FILE": str(path)}
    off_loopback = Identities({**env, PUBLISHED_REFUSED_ENV: "1"})
    assert user_for(off_loopback, "tok-u1-0123456789").user_id == "u-1"

    path.write_text(json.dumps({**own, **published}))
    for token in ("dev-a1", "tok-u1-0123456789"):
        assert refusal(off_loopback, token).status == 401
    [said] = file_problems(caplog)
    assert "takes the published development token dev-a1" in said, said
    assert user_for(Identities(env), "dev-a1").user_id == "a-1"  # loopback

    path.write_text(json.dumps(own))  # removed
    assert user_for(off_loopback, "tok-u1-0123456789").user_id == "u-1"
    with pytest.raises(PublishedTokenTaken):
        Identities({"LOOPWRIGHT_TOKENS": json.dumps(published), PUBLISHED_REFUSED_ENV: "1"})


@pytest.mark.usefixtures("checked_every_request")
def test_a_token_table_deleted_or_broken_revokes_every_token_of_it_until_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail closed: a table deleted holds nobody; an edit that revokes u-1 but breaks another
    entry keeps nobody in (least of all u-1) rather than the last good table; each said once."""
    caplog.set_level("ERROR", logger="loopwright.server.watched_file")
    both = {"tok-u1-0123456789": {"user_id": "u-1"}, "tok-u2-0123456789": {"user_id": "u-2"}}
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(hashed_table(both)))
    identities = Identities({"LOOPWRIGHT_TOKENS_FILE": str(path)})
    assert user_for(identities, "tok-u1-0123456789").user_id == "u-1"

    path.unlink()
    for _ in range(3):
        assert refusal(identities, "tok-u1-0123456789").status == 401
    [gone] = file_problems(caplog)
    assert gone == f"{path}: No such file or directory; nothing of it is taken until it is fixed"

    path.write_text(json.dumps(hashed_table(both)))
    assert user_for(identities, "tok-u2-0123456789").user_id == "u-2"  # back with the file

    revoked = hashed_table({"tok-u2-0123456789": {"user_id": "u-2"}})
    broken = json.dumps({**revoked, "tok-u3-0123456789": {"user_id": "u 3"}})
    path.write_text(broken)  # u-1 revoked, and a plain token, u-3's, with a spaced user id
    for token in ("tok-u1-0123456789", "tok-u2-0123456789", "tok-u2-0123456789"):
        assert refusal(identities, token).status == 401
    [_, broken_table] = file_problems(caplog)
    assert "tok-... is stored in plain" in broken_table and "\n" not in broken_table

    path.write_text(json.dumps(revoked))  # fixed
    assert user_for(identities, "tok-u2-0123456789").user_id == "u-2"
    assert refusal(identities, "tok-u1-0123456789").status == 401
    path.write_bytes(b'{"\xff": {}}')  # not text at all
    assert refusal(identities, "tok-u2-0123456789").status == 401
    assert "not UTF-8 text" in file_problems(caplog)[-1]


@pytest.mark.usefixtures("checked_every_request")
def test_a_key_file_deleted_or_broken_takes_no_token_until_fixed(
    provider: IdentityProvider, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("ERROR", logger="loopwright.server.watched_file")
    path = provider.write_jwks(tmp_path / "jwks.json")
    identities = Identities(provider.env(str(path)))
    token = provider.token("u-1", ["customer"])
    assert user_for(identities, token).user_id == "u-1"

    path.unlink()
    for _ in range(3):
        assert "unknown key (kid 'key-1')" in refusal(identities, token).detail
    assert len(file_problems(caplog)) == 1
    provider.write_jwks(path)
    assert user_for(identities, token).user_id == "u-1"
    path.write_text('{"keys": [')  # half a write
    assert refusal(identities, token).status == 401
    [_, half] = file_problems(caplog)
    assert "not JSON" in half


def test_tokens_new_makes_a_token_and_its_entry_and_hash_refuses_a_short_one() -> None:
    made = cli(
        "tokens",
        "new",
        "--user",
        "a-1",
        "--role",
        "approver",
        "--tenant",
        "bank-a",
        env={},
        expect=0,
    )
    token, entry = made.stdout.splitlines()
    identities = Identities({"LOOPWRIGHT_TOKENS": entry})
    assert user_for(identities, token) == ANN
    hashed = cli("tokens", "hash", token, env={}, expect=0)
    assert hashed.stdout.strip() == next(iter(json.loads(entry)))
    short = cli("tokens", "hash", "dev-u1", env={}, expect=2)
    assert short.stderr.count("\n") == 1 and "guessable" in short.stderr
    bad = cli("tokens", "new", "--user", "a 1", "--role", "approver", env={}, expect=2)
    assert bad.stderr.count("\n") == 1 and "user_id" in bad.stderr


def test_a_new_token_is_never_taken_for_an_option_on_a_command_line() -> None:
    """One random URL-safe token in 64 begins with "-", which `tokens hash TOKEN` (as any
    command) read as an option: every token made begins with the same prefix instead."""
    made = [new_token() for _ in range(1000)]
    assert not [token for token in made if token.startswith("-")]
    assert len(set(made)) == len(made)


def test_tokens_new_refuses_a_role_the_agent_grants_nothing_by() -> None:
    """The role names are the agent's (`Roles`): `sre` grants nothing with the reference agent,
    whose operators are `operator`, and reads the metrics with a desk that calls them so."""
    desk = ("--agent", "tests.desk_roles_agent:agent")
    idle = cli("tokens", "new", "--user", "o-1", "--role", "sre", env={}, expect=2)
    assert idle.stderr.count("\n") == 1
    assert (
        "role 'sre' grants nothing with agent refunds, whose roles are start: customer;"
        in idle.stderr
    )
    made = cli("tokens", "new", "--user", "o-1", "--role", "sre", *desk, env={}, expect=0)
    token, entry = made.stdout.splitlines()
    assert user_for(Identities({"LOOPWRIGHT_TOKENS": entry}), token) == User("o-1", ("sre",))
    mixed = cli(
        "tokens",
        "new",
        "--user",
        "u-1",
        "--role",
        "agent",
        "--role",
        "customer",
        *desk,
        env={},
        expect=2,
    )
    assert "role 'customer' grants nothing with agent desk" in mixed.stderr
    unnamed = cli("tokens", "new", "--user", "o-1", "--role", "", env={}, expect=2)
    assert "role '' grants nothing" in unnamed.stderr
    twice = ("--role", "customer", "--role", "customer")
    made = cli("tokens", "new", "--user", "u-1", *twice, env={}, expect=0)
    assert next(iter(json.loads(made.stdout.splitlines()[1]).values()))["roles"] == ["customer"]


@pytest.mark.parametrize(
    ("args", "env", "problem"),
    [
        (["--engine", "aegra"], {}, "no identities: set LOOPWRIGHT_JWKS"),
        (["--engine", "aegra"], {"LOOPWRIGHT_TOKENS_FILE": str(DEV_TOKENS)}, "stored in plain"),
        ([], {"LOOPWRIGHT_JWT_ALGORITHMS": "HS256"}, "HS256 refused"),
    ],
)
def test_serve_refuses_identities_no_server_could_use_before_starting(
    provider: IdentityProvider,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    problem: str,
) -> None:
    if "LOOPWRIGHT_JWT_ALGORITHMS" in env:
        env = provider.env(str(provider.write_jwks(tmp_path / "jwks.json"))) | env
    unset = {
        name: "" for name in ("LOOPWRIGHT_TOKENS", "LOOPWRIGHT_TOKENS_FILE", "LOOPWRIGHT_JWKS")
    }
    with reserved_ports(2) as port:  # aegra: two instances, on port and the next
        refused = cli(
            *("serve", "--port", str(port), "--db", "postgresql://nobody@127.0.0.1:1/none", *args),
            env={"LOOPWRIGHT_HOME": str(tmp_path / "home"), **unset, **env},
            expect=2,
        )
    assert refused.stderr.count("\n") == 1 and problem in refused.stderr, refused.stderr
    assert not (tmp_path / "home").exists()  # nothing started


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LOOPWRIGHT_RUNS_PER_PRINCIPAL", "two"),
        ("LOOPWRIGHT_LEASE_TTL_S", "0"),
        ("LOOPWRIGHT_TRACE", "of"),
        ("LOOPWRIGHT_TRACE_RAW_ARGS", "ture"),
    ],
)
def test_serve_refuses_a_setting_its_server_could_not_use_before_starting(
    tmp_path: Path, name: str, value: str
) -> None:
    """A setting the server reads from the environment is refused by serve, in one line naming
    it, before anything starts (the server found it only at its first request)."""
    with reserved_ports(2) as port:  # aegra: two instances, on port and the next
        refused = cli(
            *("serve", "--engine", "aegra", "--dev-tokens", "--port", str(port)),
            *("--db", "postgresql://nobody@127.0.0.1:1/none"),
            env={"LOOPWRIGHT_HOME": str(tmp_path / "home"), name: value},
            expect=2,
        )
    assert refused.stderr.count("\n") == 1 and name in refused.stderr, refused.stderr
    assert not (tmp_path / "home").exists()  # nothing started


def test_an_aegra_instance_with_unusable_identities_does_not_start(tmp_path: Path) -> None:
    """Not served with no identities: Aegra would serve everyone as one anonymous identity
    were its auth module to fail as it loads."""
    env = {
        **os.environ,
        "LOOPWRIGHT_JWKS": str(tmp_path / "missing.json"),
        "LOOPWRIGHT_JWT_ISSUER": ISSUER,
        "LOOPWRIGHT_JWT_AUDIENCE": AUDIENCE,
    }
    with reserved_ports(1) as port:
        started = subprocess.run(
            [sys.executable, "-m", "loopwright.server.aegra", "--port", str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert started.returncode == 1
    assert (
        started.stderr
        == f"identities: LOOPWRIGHT_JWKS: {tmp_path}/missing.json: No such file or directory\n"
    )
