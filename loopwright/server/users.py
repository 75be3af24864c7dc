"""Who a bearer token names: a user of a tenant, with roles, whichever way it was proven.

Both ways a server learns identities (`server.bearer_tokens`, `server.jwt_identity`) end in a
`User`, checked by the same rules: an id and tenant are short words (they are stamped on
threads, stored with every run and shown to approvers), roles are words. What a role grants is
the hosted agent's to say (`Agent.roles`, `core.roles`): the checks are given it, so this module
knows no agent's role name (only the server's own, below) and imports no agent.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopwright.core.text import validation_problems

# The role and user id of a served process's own identity (`server.service_identity`): no token
# table or identity provider may grant the one or name the other.
SERVICE_ROLE = "loopwright-service"
SERVICE_USER_ID = "loopwright-service"


class IdentityConfigError(ValueError):
    """The identity settings (token table, JWT keys and claims) cannot be used; the message
    names the setting or entry and why, in one line."""


@dataclass(frozen=True)
class User:
    user_id: str
    roles: tuple[str, ...]
    tenant: str = "default"


class _UserFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(pattern=r"^[A-Za-z0-9._@-]{1,64}$")
    roles: tuple[str, ...] = ()
    tenant: str = Field(default="default", pattern=r"^[A-Za-z0-9._-]{1,64}$")


def user_of(fields: object) -> User:
    """A `User` of `{"user_id", "roles", "tenant"}` (tenant optional); ValueError saying what
    is wrong in one line otherwise."""
    try:
        parsed = _UserFields.model_validate(fields)
    except ValidationError as exc:
        raise ValueError(validation_problems(exc)) from None
    if SERVICE_ROLE in parsed.roles:
        raise ValueError(f"roles: {SERVICE_ROLE!r} is the server's own, no user's")
    if parsed.user_id.casefold() == SERVICE_USER_ID:  # nor a look-alike shown to approvers
        raise ValueError(f"user_id: {parsed.user_id!r} is the server's own, no user's")
    # A role named twice grants what it grants once: the entry names it once.
    return User(parsed.user_id, tuple(dict.fromkeys(parsed.roles)), parsed.tenant)
