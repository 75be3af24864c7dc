"""Which role names grant what: an agent's own words for the runtime's three capabilities.

A caller's identity (a token table entry, a JWT's roles claim) carries the role names of the
team's identity provider: a support desk's `agent`, `supervisor` and `sre`, a bank's `client`,
`reviewer` and `ops`. The runtime grants three capabilities by role, and the agent says which of
its names grant each (`Agent(roles=Roles(...))`), so nobody renames their roles to ours:

* `start`: start runs, each acting for whoever starts it (their own threads, their own tasks);
* `decide`: see and decide the approvals of their tenant's runs, never on a run of their own
  (the agent's `approvers` rule applies on top: both must say yes);
* `operate`: read the operator's metrics, which count every tenant's runs.

Every check of a capability, on either engine and in the CLI, asks `Roles.grants`. The default
names are the words the runtime always used (`customer`, `approver`, `operator`), so an agent
that names none keeps working with the token tables and identity providers it has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

Capability = Literal["start", "decide", "operate"]
# What each capability lets its holder do, as a refusal names it.
_DOING: dict[Capability, str] = {
    "start": "starting runs",
    "decide": "deciding approvals",
    "operate": "reading the metrics",
}


@dataclass(frozen=True)
class Roles:
    """The role names that grant each capability: `start` (start runs), `decide` (see and
    decide approvals) and `operate` (read the metrics), one name or several each; a caller
    holding any of a capability's names has it.

    Refused when made (ValueError, one line): a capability with no name, a name that is blank
    or not one word (a roles claim spelled as `scope` is split on spaces: such a name could
    never be held), a name given twice, and a name that would grant starting runs together
    with deciding approvals (every starter could approve every other starter's actions) or
    with reading the metrics (which count every tenant's runs, not the starter's own). A person
    who does both holds two roles. Deciding and operating may share a name."""

    start: tuple[str, ...] = ("customer",)
    decide: tuple[str, ...] = ("approver",)
    operate: tuple[str, ...] = ("operator",)

    def __post_init__(self) -> None:
        for capability in get_args(Capability):
            names = getattr(self, capability)
            if isinstance(names, str):
                raise ValueError(
                    f"Roles: {capability}={names!r} is one string: give a tuple of role names,"
                    f" {capability}=({names!r},)"
                )
            names = tuple(names)
            object.__setattr__(self, capability, names)  # a list given is kept as a tuple
            if not names:
                raise ValueError(
                    f"Roles: {capability} names no role, so nobody could be {_DOING[capability]}"
                )
            for name in names:
                if not isinstance(name, str) or not name or name != "".join(name.split()):
                    raise ValueError(
                        f"Roles: {capability} names {name!r}: a role name is one word, as an"
                        " identity's roles are"
                    )
                if names.count(name) > 1:
                    raise ValueError(f"Roles: {capability} names {name!r} twice")
        for other in ("decide", "operate"):
            if shared := sorted(set(self.start) & set(getattr(self, other))):
                raise ValueError(
                    f"Roles: {', '.join(shared)} would grant both starting runs and"
                    f" {_DOING[other]}; give {other} a role of its own (a person may hold both)"
                )

    def grants(self, capability: Capability, held: Iterable[str]) -> bool:
        """Whether an identity holding the role names `held` has `capability` ("start",
        "decide" or "operate"): the one question every entry point asks before it lets a caller
        start runs, decide approvals or read the metrics."""
        return not set(getattr(self, capability)).isdisjoint(held)

    def refusal(self, capability: Capability) -> str:
        """What a caller without `capability` is told, naming the roles that grant it."""
        names = getattr(self, capability)
        role = "the role" if len(names) == 1 else "one of the roles"
        return f"{_DOING[capability]} takes {role} {', '.join(names)}"

    def granting(self, name: str) -> list[Capability]:
        """The capabilities role `name` grants (none: a name this agent does not use)."""
        return [c for c in get_args(Capability) if self.grants(c, [name])]

    def __str__(self) -> str:
        return "; ".join(f"{c}: {', '.join(getattr(self, c))}" for c in get_args(Capability))


# What an agent that names no roles grants by: the runtime's words before roles were the agent's.
DEFAULT_ROLES = Roles()
