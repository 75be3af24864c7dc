"""Version 2 of the reference agent, for the upgrade tests: the same tools and rules under a
new version, hosted by import path (`tests.upgraded_agent:agent`) as a deployment of new code
would host it."""

from __future__ import annotations

from loopwright_refunds.agent import agent as version_1

agent = version_1.replace(version="2")
