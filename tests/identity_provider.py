"""An identity provider for tests: its own signing keys (made here), a JWKS of them (as a file
or served on loopback), and JWTs signed with them, as an OIDC provider would issue them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import FastAPI
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tests.stub_server import serve_app

ISSUER = "https://id.example.test/"
AUDIENCE = "loopwright"


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @classmethod
    def new(cls, kid: str, alg: str = "RS256") -> SigningKey:
        if alg == "ES256":
            return cls(kid, alg, ec.generate_private_key(ec.SECP256R1()))
        return cls(kid, alg, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def jwk(self) -> dict[str, Any]:
        algorithm = ECAlgorithm if self.alg.startswith("ES") else RSAAlgorithm
        public = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**public, "kid": self.kid, "alg": self.alg, "use": "sig"}


@dataclass
class IdentityProvider:
    keys: list[SigningKey] = field(default_factory=lambda: [SigningKey.new("key-1")])
    fetches: int = 0  # of its JWKS URL

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.jwk() for key in self.keys]}

    def write_jwks(self, path: Path) -> Path:
        """The JWKS as a file, replaced whole (a new inode), as a config manager writes it."""
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(self.jwks()))
        staged.replace(path)
        return path

    def token(
        self,
        user_id: str | None,
        roles: list[str] | None = None,
        tenant: str | None = "default",
        *,
        key: SigningKey | None = None,
        lifetime_s: float = 600.0,
        **claims: Any,
    ) -> str:
        """A JWT for `user_id` signed with `key` (the first one), valid for `lifetime_s`; a
        claim given as None is left out."""
        now = time.time()
        signer = key or self.keys[0]
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": user_id,
            "tenant": tenant,
            "roles": roles,
            "iat": int(now),
            "exp": int(now + lifetime_s),
            **claims,
        }
        payload = {name: value for name, value in payload.items() if value is not None}
        return jwt.encode(
            payload, signer.private, algorithm=signer.alg, headers={"kid": signer.kid}
        )

    def env(self, jwks: str) -> dict[str, str]:
        """The server settings that take this provider's tokens, its keys at `jwks`."""
        return {
            "LOOPWRIGHT_JWKS": jwks,
            "LOOPWRIGHT_JWT_ISSUER": ISSUER,
            "LOOPWRIGHT_JWT_AUDIENCE": AUDIENCE,
        }

    @contextmanager
    def served(self) -> Iterator[str]:
        """Its JWKS on a loopback URL, counting the fetches."""
        app = FastAPI()

        @app.get("/.well-known/jwks.json")
        def jwks() -> dict[str, Any]:
            self.fetches += 1
            return self.jwks()

        with serve_app(app) as url:
            yield f"{url}/.well-known/jwks.json"
