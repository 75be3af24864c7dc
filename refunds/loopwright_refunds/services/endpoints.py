"""Where the reference business services listen.

The runtime never starts or owns these services; it only needs their base URLs. The CLI and the
test fixtures start them (see `services.launcher`) and hand the endpoints to the run context.
"""

from __future__ import annotations

import functools
import os
import ssl

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

ENV_VAR = "LOOPWRIGHT_SERVICES"


class ServiceEndpoints(BaseModel):
    """Base URLs of the three reference services, e.g. ``http://127.0.0.1:43121``."""

    model_config = ConfigDict(frozen=True)

    orders: str
    policies: str
    payments: str

    def to_env(self) -> dict[str, str]:
        """The environment a child process needs to reach the same services."""
        return {ENV_VAR: self.model_dump_json()}

    @classmethod
    def from_env(cls) -> ServiceEndpoints | None:
        """The endpoints $LOOPWRIGHT_SERVICES names, if set; ValueError naming the variable for
        anything but the JSON object `to_env` writes."""
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError:
            raise ValueError(
                f"{ENV_VAR}={raw!r} is not a JSON object of the orders, policies and payments"
                " services' base URLs"
            ) from None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context, made once per process for every client that
    reaches the services: httpx makes one per client, even for a plain-HTTP URL, and loading
    its roots costs 10-50 ms of CPU (each check of the payments service paid it again)."""
    return httpx.create_ssl_context()
