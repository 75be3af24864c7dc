"""Skills in the loop: validate answers the model's `load_skill` calls (`tools.skills`).

A skill the model asks for is loaded into the run's state whole (its body and programs, by
version), recorded in V, and answered at once; from the next model step on its body is part of
the trusted system message (`nodes.compile_context.render`). A skill the run loaded already is
answered with the version it has: a resumed run goes on with what it loaded, whatever the
agent's folder holds now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from pydantic import ValidationError

from loopwright.core.protocol import ToolEnvelope
from loopwright.core.state import CallVerdict, PendingCall, RunState, Versions
from loopwright.core.views import tool_result
from loopwright.nodes.context import RunContext
from loopwright.tools.skills import SKILL_TOOL, LoadedSkill, LoadSkillArgs, SkillContract


def offered(context: RunContext, tools: list[str]) -> SkillContract | None:
    """The agent's skills, if the model is offered them now."""
    contract = context.tools.get(SKILL_TOOL)
    return contract if isinstance(contract, SkillContract) and SKILL_TOOL in tools else None


def loaded_skills(state: RunState) -> list[LoadedSkill]:
    return [LoadedSkill.model_validate(s) for s in (state.get("skills") or {}).values()]


@dataclass
class Loading:
    """What validate's pass adds when the model asked for skills."""

    calls: list[PendingCall]
    answers: list[ToolMessage] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)


def load(
    state: RunState, context: RunContext, calls: list[PendingCall], tools: list[str]
) -> Loading | None:
    """Answer each new `load_skill` call (None: there is none, or no skills are offered)."""
    contract = offered(context, tools)
    asked = [c for c in calls if c.tool == SKILL_TOOL and c.verdict is None]
    if contract is None or not asked:
        return None
    skills = dict(state.get("skills") or {})
    out = Loading(calls=list(calls))
    for call in asked:
        envelope, loaded = _load_one(call, contract, skills)
        if loaded is not None:
            skills[loaded.name] = loaded.model_dump(mode="json")
        verdict = CallVerdict.DONE if envelope.status == "ok" else CallVerdict.REJECTED
        answered = call.model_copy(update={"verdict": verdict, "error": envelope.error})
        out.calls = [answered if c.call_id == call.call_id else c for c in out.calls]
        out.answers.append(tool_result(answered, envelope))
    versions = Versions.model_validate(state.get("versions") or {})
    versions.skills = {name: raw["version"] for name, raw in skills.items()}
    out.update = {"skills": skills, "versions": versions.model_dump(mode="json")}
    return out


def _load_one(
    call: PendingCall, contract: SkillContract, skills: dict[str, Any]
) -> tuple[ToolEnvelope, LoadedSkill | None]:
    try:
        name = LoadSkillArgs.model_validate(call.args).name
    except ValidationError as exc:
        error = {"code": "invalid_arguments", "detail": f"load_skill: {exc.error_count()} errors"}
        return ToolEnvelope(status="error", error=error), None
    if name in skills:
        loaded = LoadedSkill.model_validate(skills[name])  # the version this run loaded
    elif (skill := contract.skill(name)) is not None:
        loaded = LoadedSkill.of(skill)
    else:
        known = ", ".join(s.name for s in contract.skills)
        error = {"code": "unknown_skill", "detail": f"no skill {name[:64]!r}; skills: {known}"}
        return ToolEnvelope(status="error", error=error), None
    result = {"skill": name, "version": loaded.version, "programs": sorted(loaded.programs)}
    return ToolEnvelope(status="ok", result=result), loaded
