"""Role names are the agent's (`Roles`): what each grants, and what is refused when it is made.

The served checks (the auth hooks, the inbox, the metrics route, the served graph) are proven
against a real server in tests/test_served_roles.py; here, the value itself and the agent.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopwright import Agent, Roles, ToolDefinitionError

DESK = Roles(start=("agent",), decide=("supervisor", "lead"), operate=("sre",))

pytestmark = pytest.mark.quick


def test_each_capability_is_granted_by_the_agents_names_only() -> None:
    assert DESK.grants("start", ["agent"])
    assert DESK.grants("decide", ["agent", "lead"])  # any one of its names will do
    assert DESK.grants("operate", ("sre",))
    # The runtime's own words grant nothing to an agent that uses others.
    assert not DESK.grants("start", ["customer"])
    assert not DESK.grants("decide", ["approver", "agent"])
    assert not DESK.grants("operate", ["operator", "supervisor"])
    assert not DESK.grants("start", [])
    assert DESK.granting("lead") == ["decide"] and DESK.granting("customer") == []


def test_an_agent_that_names_no_roles_keeps_the_words_it_always_had() -> None:
    agent: Agent[None] = Agent("plain", instructions="Do things.")
    assert agent.roles == Roles(start=("customer",), decide=("approver",), operate=("operator",))
    assert agent.roles.grants("start", ["customer"]) and agent.roles.grants("decide", ["approver"])
    assert agent.roles.refusal("decide") == "deciding approvals takes the role approver"
    desk = agent.replace(roles=DESK)
    assert desk.roles is DESK
    assert DESK.refusal("decide") == "deciding approvals takes one of the roles supervisor, lead"


def test_a_run_started_for_a_user_holds_the_roles_that_start_runs() -> None:
    """Without a `principal` of the agent's own, whom a run acts for holds the agent's `start`
    names (not the runtime's `customer`); an agent's own `principal` keeps its roles."""
    desk: Agent[None] = Agent("desk", instructions="Answer tickets.", roles=DESK)
    assert desk.principal_for(None, "u-1", "a task").roles == ("agent",)
    plain: Agent[None] = Agent("plain", instructions="Do things.")
    assert plain.principal_for(None, "u-1", "a task").roles == ("customer",)


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"start": ()}, "start names no role, so nobody could be starting runs"),
        ({"operate": []}, "operate names no role, so nobody could be reading the metrics"),
        ({"decide": "supervisor"}, "decide='supervisor' is one string: give a tuple"),
        ({"start": ("",)}, "start names '': a role name is one word"),
        ({"decide": ("team lead",)}, "decide names 'team lead': a role name is one word"),
        ({"operate": (" sre",)}, "operate names ' sre': a role name is one word"),
        ({"start": (None,)}, "start names None: a role name is one word"),
        ({"decide": ("lead", "lead")}, "decide names 'lead' twice"),
        (
            {"start": ("staff",), "decide": ("staff",)},
            "staff would grant both starting runs and deciding approvals",
        ),
        (
            {"start": ("client", "ops"), "operate": ("ops",)},
            "ops would grant both starting runs and reading the metrics",
        ),
    ],
)
def test_roles_that_make_no_sense_are_refused_when_made(
    given: dict[str, Any], refused: str
) -> None:
    with pytest.raises(ValueError, match=r"^Roles: ") as raised:
        Roles(**given)
    assert refused in str(raised.value) and "\n" not in str(raised.value)


def test_deciding_and_operating_may_share_a_name_and_a_list_is_kept_as_a_tuple() -> None:
    """A single-tenant desk whose supervisors also read the metrics; the metrics count every
    tenant's runs, which is why a starting role may not read them (refused above)."""
    roles = Roles(start=["agent"], decide=("supervisor",), operate=("supervisor", "sre"))  # type: ignore[arg-type]
    assert roles.start == ("agent",) and roles.granting("supervisor") == ["decide", "operate"]
    assert hash(roles) == hash(
        Roles(start=("agent",), decide=("supervisor",), operate=("supervisor", "sre"))
    )


def test_an_agent_given_anything_but_roles_is_refused_at_definition() -> None:
    with pytest.raises(ToolDefinitionError, match=r"agent desk: roles=\['agent'\] is no Roles"):
        Agent("desk", instructions="Answer tickets.", roles=["agent"])  # type: ignore[arg-type]
