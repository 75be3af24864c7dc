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
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from loopwright.server.bearer_tokens import (
    TokenTableError,
    hash_token,
    hashed_table,
    new_token,
)
from loopwright.server.identities import Identities, IdentityRefused
from loopwright.server.launch import DEV_TOKENS
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
    restart. A broken write in between keeps the keys held."""
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
    path.write_text('{"keys": [')  # half a write: not used
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
    forged = provider.token("u-9", [SERVICE_ROLE])
    assert refusal(from_file, forged).status == 401
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
    path.write_text('{"tok-plain": {"user_id": "u-3"}}')  # plain: refused, the last good kept
    wait_for(lambda: identities.table.user_for("tok-plain") is None, timeout=5)
    assert user_for(identities, "tok-u2-0123456789").user_id == "u-2"


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
