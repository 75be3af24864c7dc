"""Bearer JWTs, verified offline against the identity provider's signing keys.

Configured from the environment (the same on every instance):

* `LOOPWRIGHT_JWKS`: the provider's key set, a file path or an https:// (or http://) URL;
* `LOOPWRIGHT_JWT_ISSUER`, `LOOPWRIGHT_JWT_AUDIENCE`: what `iss` and `aud` must say (required:
  a token another service was issued, by the same provider, is no token for this one);
* `LOOPWRIGHT_JWT_ALGORITHMS`: default `RS256,ES256`; any of RS/PS/ES 256/384/512 and EdDSA;
* `LOOPWRIGHT_JWT_LEEWAY_S`: clock skew forgiven on `exp`, `nbf` and `iat`, default 30;
* `LOOPWRIGHT_JWT_MAX_LIFETIME_S`: the longest a token may be valid for, default 86400 (24 h):
  `exp - iat`, or `exp` - now for a token without `iat` (a token that outlives its user's
  revocation by days is refused however well signed);
* `LOOPWRIGHT_JWT_USER_CLAIM`, `..._TENANT_CLAIM`, `..._ROLES_CLAIM`: the claims that name the
  user (default `sub`), the tenant (`tenant`) and the roles (`roles`: a list, or words separated
  by spaces as in `scope`); a dotted name reads a nested claim (`realm_access.roles`; no empty
  part: `a..b` is refused at the start);
* `LOOPWRIGHT_JWKS_TTL_S` (default 300) and `LOOPWRIGHT_JWKS_REFETCH_S` (30): a URL's keys are
  fetched again once older than the TTL, and on an unknown key id at most once per refetch
  interval (`server.jwks`).

A token must be signed by a key of the set (named by its `kid`), with an allowed algorithm,
carry `exp`, `iss` and `aud`, its times (`exp`, `nbf`, `iat`) numbers (never strings), be within
its validity (`exp`, `nbf`, with the leeway) and the maximum lifetime, and name a user, tenant
and roles. `none` and the HMAC algorithms (HS*) are refused, always: an HMAC
key verifies and signs alike, so every server holding it could mint any identity, and mixing
it with public keys is the classic algorithm-confusion hole; providers publish asymmetric keys.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from loopwright.server.jwks import FileKeys, JwksError, KeySource, UrlKeys
from loopwright.server.users import IdentityConfigError, User, user_of

JWKS_ENV = "LOOPWRIGHT_JWKS"
ISSUER_ENV = "LOOPWRIGHT_JWT_ISSUER"
AUDIENCE_ENV = "LOOPWRIGHT_JWT_AUDIENCE"
ALGORITHMS_ENV = "LOOPWRIGHT_JWT_ALGORITHMS"
LEEWAY_ENV = "LOOPWRIGHT_JWT_LEEWAY_S"
MAX_LIFETIME_ENV = "LOOPWRIGHT_JWT_MAX_LIFETIME_S"
USER_CLAIM_ENV = "LOOPWRIGHT_JWT_USER_CLAIM"
TENANT_CLAIM_ENV = "LOOPWRIGHT_JWT_TENANT_CLAIM"
ROLES_CLAIM_ENV = "LOOPWRIGHT_JWT_ROLES_CLAIM"
JWKS_TTL_ENV = "LOOPWRIGHT_JWKS_TTL_S"
JWKS_REFETCH_ENV = "LOOPWRIGHT_JWKS_REFETCH_S"

ASYMMETRIC_ALGORITHMS = frozenset(
    {f"{family}{bits}" for family in ("RS", "PS", "ES") for bits in (256, 384, 512)} | {"EdDSA"}
)
DEFAULT_ALGORITHMS = ("RS256", "ES256")
DEFAULT_MAX_LIFETIME_S = 86_400.0
TIME_CLAIMS = ("exp", "nbf", "iat")


class JwtRefused(Exception):
    """The token proves no identity here; the message says why, in one line."""


class KeysUnavailable(Exception):
    """No signing keys could be had yet (the key URL did not answer): no token can be checked."""


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts, the first a JSON object (`{"` is `eyJ`)."""
    return token.startswith("eyJ") and token.count(".") == 2


@dataclass(frozen=True)
class JwtSettings:
    jwks: str
    issuer: str
    audience: str
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway_s: float = 30.0
    max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S
    user_claim: str = "sub"
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"
    ttl_s: float = 300.0
    refetch_s: float = 30.0

    @property
    def is_url(self) -> bool:
        return self.jwks.startswith(("https://", "http://"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> JwtSettings | None:
        """The settings the environment gives, or None without `LOOPWRIGHT_JWKS`."""
        jwks = environ.get(JWKS_ENV, "").strip()
        if not jwks:
            return None
        named = {name: environ.get(name, "").strip() for name in (ISSUER_ENV, AUDIENCE_ENV)}
        if missing := [name for name, value in named.items() if not value]:
            raise IdentityConfigError(
                f"{JWKS_ENV} is set: {' and '.join(missing)} must be too, not blank (tokens are"
                " checked for whom they were issued by and for)"
            )
        algorithms = tuple(
            a.strip() for a in environ.get(ALGORITHMS_ENV, ",".join(DEFAULT_ALGORITHMS)).split(",")
        )
        if refused := [a for a in algorithms if a not in ASYMMETRIC_ALGORITHMS]:
            raise IdentityConfigError(
                f"{ALGORITHMS_ENV}: {', '.join(refused) or 'nothing'} refused; take one or more"
                f" of {', '.join(sorted(ASYMMETRIC_ALGORITHMS))} (never none or HS*: a shared"
                " secret signs as well as it verifies)"
            )
        claims = {
            name: environ.get(name, default).strip()
            for name, default in (
                (USER_CLAIM_ENV, "sub"),
                (TENANT_CLAIM_ENV, "tenant"),
                (ROLES_CLAIM_ENV, "roles"),
            )
        }
        if unusable := [name for name, claim in claims.items() if not _claim_path(claim)]:
            raise IdentityConfigError(
                f"{', '.join(unusable)}: a claim name, or names joined by single dots"
                " (realm_access.roles), none blank or spaced"
            )
        return cls(
            jwks=jwks,
            issuer=named[ISSUER_ENV],
            audience=named[AUDIENCE_ENV],
            algorithms=algorithms,
            leeway_s=_seconds(environ, LEEWAY_ENV, 30.0, most=300.0),
            max_lifetime_s=_seconds(
                environ, MAX_LIFETIME_ENV, DEFAULT_MAX_LIFETIME_S, most=30 * 86_400.0
            ),
            user_claim=claims[USER_CLAIM_ENV],
            tenant_claim=claims[TENANT_CLAIM_ENV],
            roles_claim=claims[ROLES_CLAIM_ENV],
            ttl_s=_seconds(environ, JWKS_TTL_ENV, 300.0, most=86_400.0),
            refetch_s=_seconds(environ, JWKS_REFETCH_ENV, 30.0, most=3_600.0),
        )


def _claim_path(name: str) -> bool:
    """Whether `name` names a claim: words without spaces, joined by single dots."""
    return all(part and not any(c.isspace() for c in part) for part in name.split("."))


def _seconds(environ: Mapping[str, str], name: str, default: float, *, most: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= most:
        raise IdentityConfigError(f"{name}={raw}: seconds from 0 to {most:g}")
    return value


def key_source(settings: JwtSettings) -> KeySource:
    """Where the keys come from: the URL (fetched at the first token) or the file (read now:
    a file that is missing or holds no usable key is an IdentityConfigError)."""
    if settings.is_url:
        return UrlKeys(
            settings.jwks, settings.algorithms, ttl_s=settings.ttl_s, refetch_s=settings.refetch_s
        )
    try:
        return FileKeys(settings.jwks, settings.algorithms)
    except JwksError as exc:
        raise IdentityConfigError(f"{JWKS_ENV}: {exc}") from None


# Why PyJWT refused a token, in the words a client is told.
_REFUSALS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet (nbf, iat)"),
    (jwt.InvalidIssuerError, "the token was issued by another issuer (iss)"),
    (jwt.InvalidAudienceError, "the token is for another audience (aud)"),
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.InvalidAlgorithmError, "the token's algorithm does not match its key"),
)


class JwtVerifier:
    def __init__(self, settings: JwtSettings, source: KeySource | None = None) -> None:
        self.settings = settings
        self.source = key_source(settings) if source is None else source

    def key_id(self, token: str) -> str:
        """The key id the token's header names (read before any check: which key to check by),
        its algorithm checked allowed; JwtRefused otherwise."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise JwtRefused("the token is not a well-formed JWT") from None
        alg = header.get("alg")
        if alg not in self.settings.algorithms:
            raise JwtRefused(
                f"the token is signed with {str(alg)[:16]!r}: this server takes"
                f" {', '.join(self.settings.algorithms)}"
            )
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise JwtRefused("the token names no signing key (kid)")
        return kid

    def verify(self, token: str) -> User:
        """The user a valid token names; JwtRefused saying why it is not valid, or
        KeysUnavailable. No I/O: the key source's `refresh` comes first where `due`."""
        kid = self.key_id(token)
        held = self.source.keys()
        if held is None:
            raise KeysUnavailable("the identity provider's signing keys could not be fetched")
        key = held.keys.get(kid)
        if key is None:
            raise JwtRefused(f"the token is signed by an unknown key (kid {kid[:40]!r})")
        s = self.settings
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(s.algorithms),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.MissingRequiredClaimError as exc:
            raise JwtRefused(f"the token has no {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            reason = next((r for kind, r in _REFUSALS if isinstance(exc, kind)), None)
            raise JwtRefused(reason or "the token is not a valid JWT") from None
        self._check_times(claims)
        return self.user_of(claims)

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        """JwtRefused for times that are not numbers (PyJWT reads `"exp": "1700000000"` as
        one) or a token valid for longer than the maximum lifetime."""
        for name in TIME_CLAIMS:
            value = claims.get(name)
            if value is not None and not _is_number(value):
                raise JwtRefused(f"the token's {name} is not a number of seconds (NumericDate)")
        most = self.settings.max_lifetime_s
        if (issued := claims.get("iat")) is not None:
            lifetime = claims["exp"] - issued
        else:  # what is left of it, with the clock skew forgiven (an issuer ahead of us)
            lifetime = claims["exp"] - time.time() - self.settings.leeway_s
        if lifetime > most:
            raise JwtRefused(f"the token is valid for longer than {most:g} s ({MAX_LIFETIME_ENV})")

    def user_of(self, claims: Mapping[str, Any]) -> User:
        s = self.settings
        wanted = {"user_id": s.user_claim, "tenant": s.tenant_claim, "roles": s.roles_claim}
        named = {field: _claim(claims, name) for field, name in wanted.items()}
        if missing := [wanted[field] for field, value in named.items() if value is None]:
            raise JwtRefused(f"the token has no {' and no '.join(missing)} claim")
        if isinstance(named["roles"], str):  # "customer approver", as OAuth's scope is spelled
            named["roles"] = named["roles"].split()
        try:
            return user_of(named)
        except ValueError as exc:
            raise JwtRefused(f"the token's claims name no user here: {exc}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim `name`, a dotted name reaching into objects; None if absent."""
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
