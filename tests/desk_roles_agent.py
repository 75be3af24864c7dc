"""The reference agent under a team's own role names, as a support desk's identity provider
calls its people: `agent` starts runs, `supervisor` decides approvals, `sre` reads the metrics
(`Agent(roles=Roles(...))`). Hosted by import path (`tests.desk_roles_agent:agent`) by
tests/test_served_roles.py, where the runtime's own words (`customer`, `approver`, `operator`)
grant nothing."""

from __future__ import annotations

from loopwright import Roles
from loopwright_refunds.agent import agent as refunds

ROLES = Roles(start=("agent",), decide=("supervisor",), operate=("sre",))
agent = refunds.replace(name="desk", roles=ROLES)
