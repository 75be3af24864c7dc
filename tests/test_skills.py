"""Skills: the model sees each skill's name and description, loads one by name, and gets its
body as the operator's trusted material; the run records the version it loaded and keeps it.

Runs of the reference agent, whose skill `refund-eligible-orders` carries a program."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from loopwright import Agent, Decision, ScriptedChatModel, ToolDefinitionError, parse_tool_content
from loopwright.tools.skills import read_skills
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import REPO, RunnerFactory, decide, principal

SKILLS = REPO / "refunds" / "loopwright_refunds" / "skills"
SKILL = "refund-eligible-orders"
TASK = "Refund each eligible order of mine: O-42, O-43 and O-45."


class SkillPolicy:
    """Loads the skill, runs its program on the orders the task names, reports the result;
    keeps the system message of every request it was sent."""

    def __init__(self, skill: str = SKILL) -> None:
        self.skill = skill
        self.systems: list[str] = []

    def __call__(
        self, messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        assert isinstance(messages[0], SystemMessage)
        self.systems.append(messages[0].text)
        asked = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
        last = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
        if not asked:
            return Decision.skill(self.skill)
        envelope = parse_tool_content(str(last.content)) if last else None
        if len(asked) == 1 and envelope is not None and envelope.status == "ok":
            program = {"skill": self.skill, "program": "refund_eligible.py"}
            inputs = {"orders": ["O-42", "O-43", "O-45"]}
            return Decision(tool_calls=[("run_program", {**program, "inputs": inputs})])
        return Decision(content=f"Done: {envelope.model_dump() if envelope else None}")


def with_policy(policy: SkillPolicy, agent: Agent[Any] = refunds) -> Agent[Any]:
    return agent.replace(model=lambda: ScriptedChatModel(policy=policy))


def test_a_loaded_skill_is_trusted_material_versioned_and_its_program_runs(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    policy = SkillPolicy()
    [skill] = read_skills(SKILLS)
    with open_test_runner(agent=with_policy(policy)) as runner:
        waiting = runner.start(TASK, principal(task=TASK), run_id="run-skill")
        done = runner.resume("run-skill", decide(waiting))
        state = runner.state("run-skill")
    # The model saw the skill's name and description before; its body only once it asked.
    assert f"- {SKILL}: {skill.description}" in policy.systems[0]
    assert skill.body not in policy.systems[0]
    assert skill.body in policy.systems[1] and f"version {skill.version}" in policy.systems[1]
    # The body reached the model in the system message, not as a tool's (untrusted) output.
    loaded = next(m for m in state["history"] if isinstance(m, ToolMessage))
    assert skill.body not in str(loaded.content)
    assert parse_tool_content(str(loaded.content)).result == {
        "skill": SKILL,
        "version": skill.version,
        "programs": ["refund_eligible.py"],
    }
    assert state["versions"]["skills"] == {SKILL: skill.version}
    assert state["program"]["skill"] == SKILL
    assert state["program"]["source"] == skill.programs["refund_eligible.py"]
    assert done.stop_reason == "completed", done.stop_detail
    assert [len(list_refunds(services, o)) for o in ("O-42", "O-43", "O-45")] == [1, 1, 0]


def test_a_resumed_run_uses_the_skill_version_it_loaded(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """The skill's folder changes while the run waits for an approval; the process that
    resumes it reads the new folder. The run goes on with the body and program it loaded."""
    folder = tmp_path / SKILL
    shutil.copytree(SKILLS / SKILL, folder)
    [before] = read_skills(folder)
    policy = SkillPolicy()
    with open_test_runner(agent=with_policy(policy, refunds.replace(skills=folder))) as runner:
        waiting = runner.start(TASK, principal(task=TASK), run_id="run-skill-v1")
    (folder / "SKILL.md").write_text(
        (folder / "SKILL.md").read_text().replace("Use this when", "Version two. Use this when")
    )
    (folder / "refund_eligible.py").write_text("'a program the run never loaded'\n")
    [after] = read_skills(folder)
    assert after.version != before.version
    with open_test_runner(agent=with_policy(policy, refunds.replace(skills=folder))) as runner:
        done = runner.resume("run-skill-v1", decide(waiting))
        state = runner.state("run-skill-v1")
    assert state["versions"]["skills"] == {SKILL: before.version}
    assert before.body in policy.systems[-1] and "Version two" not in policy.systems[-1]
    assert done.stop_reason == "completed", done.stop_detail
    assert [len(list_refunds(services, o)) for o in ("O-42", "O-43")] == [1, 1]


def test_an_unknown_skill_is_refused_in_words(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    policy = SkillPolicy(skill="no-such-skill")
    with open_test_runner(agent=with_policy(policy)) as runner:
        runner.start(TASK, principal(task=TASK), run_id="run-no-skill")
        state = runner.state("run-no-skill")
    answer = parse_tool_content(
        str(next(m for m in state["history"] if isinstance(m, ToolMessage)).content)
    )
    assert answer.error == {
        "code": "unknown_skill",
        "detail": f"no skill 'no-such-skill'; skills: {SKILL}",
    }
    assert not state.get("skills")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no front matter\n", "begins with front matter between --- lines"),
        ("---\nname: Bad Name\ndescription: x\n---\nbody\n", "name: lowercase letters"),
        ("---\nname: ok\n---\nbody\n", "description: one line saying when to use it"),
        ("---\nname: ok\ndescription: x\n---\n", "a body of 1 to"),
        ("---\nname ok\n---\nbody\n", "front matter lines are `key: value`"),
    ],
)
def test_a_skill_folder_that_cannot_be_read_is_refused_in_one_line(
    text: str, problem: str, tmp_path: Path
) -> None:
    (tmp_path / "SKILL.md").write_text(text)
    with pytest.raises(ToolDefinitionError, match=problem) as refused:
        read_skills(tmp_path)
    assert "\n" not in str(refused.value)
