"""Skills: working methods an agent carries and its model loads when it needs one.

A skill is a folder in the common format: a `SKILL.md` whose front matter names it and says in
one line what it is for, and whose body is the method itself, with optional program files
(`*.py`) the model may run as program actions. The model is shown each skill's name and
description and asks for one with the runtime's `load_skill` tool; the runtime then gives the
body to every later model request as the operator's trusted material, in the system message
(not as retrieved data). A skill is versioned by its content hash: the run records the version
it loaded (V, the trace), keeps the body and programs it loaded in its state, and goes on with
them when it is resumed, whatever the folder holds by then.

    ---
    name: close-stale-tickets
    description: Close every ticket of a queue nobody answered for 30 days, in one program.
    ---
    Read the queue first, then ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from loopwright.core.state import digest
from loopwright.tools.contract import (
    Effect,
    ToolArgs,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    ToolFault,
)
from loopwright.tools.program import MAX_SOURCE_CHARS

SKILL_TOOL = "load_skill"
SKILL_FILE = "SKILL.md"
SKILL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # the whole name: `fullmatch`
MAX_BODY_CHARS = 32_000
MAX_DESCRIPTION_CHARS = 1_024
_FRONT = re.compile(r"\A---[ \t]*\n(?P<head>.*?)\n---[ \t]*\n?(?P<body>.*)\Z", re.DOTALL)


@dataclass(frozen=True)
class Skill:
    """One skill as its folder says it: name, description, body, program files by name."""

    name: str
    description: str
    body: str
    programs: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The content hash: what a run records it loaded."""
        return digest([self.name, self.description, self.body, self.programs])[:16]


def _front_matter(head: str, where: Path) -> dict[str, str]:
    """`key: value` lines (a value may be quoted); nothing else of YAML is needed here."""
    fields: dict[str, str] = {}
    for number, line in enumerate(head.splitlines(), start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, colon, value = line.partition(":")
        if not colon or not key.strip().isidentifier():
            raise ToolDefinitionError(f"{where}:{number}: front matter lines are `key: value`")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key.strip()] = value
    return fields


def read_skill(folder: Path) -> Skill:
    """The skill in `folder`; ToolDefinitionError naming the file and what it lacks."""
    path = folder / SKILL_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolDefinitionError(f"skill {folder}: cannot read {SKILL_FILE}: {exc}") from exc
    match = _FRONT.match(text)
    if match is None:
        raise ToolDefinitionError(f"{path}: begins with front matter between --- lines")
    fields = _front_matter(match["head"], path)
    name, description = fields.get("name", ""), fields.get("description", "")
    body = match["body"].strip()
    if not SKILL_NAME.fullmatch(name):
        raise ToolDefinitionError(f"{path}: name: lowercase letters, digits and -, not {name!r}")
    if not description or len(description) > MAX_DESCRIPTION_CHARS:
        raise ToolDefinitionError(f"{path}: description: one line saying when to use it")
    if not body or len(body) > MAX_BODY_CHARS:
        raise ToolDefinitionError(f"{path}: a body of 1 to {MAX_BODY_CHARS} characters")
    programs = {}
    for program in sorted(folder.rglob("*.py")):
        source = program.read_text(encoding="utf-8")
        if len(source) > MAX_SOURCE_CHARS:
            raise ToolDefinitionError(f"{program}: a program of at most {MAX_SOURCE_CHARS} chars")
        programs[program.relative_to(folder).as_posix()] = source
    return Skill(name=name, description=description, body=body, programs=programs)


def read_skills(sources: str | Path | Iterable[str | Path]) -> tuple[Skill, ...]:
    """Skills from folders: a folder holding a SKILL.md is one skill; any other folder is a
    library, each subfolder holding a SKILL.md one skill."""
    roots = [sources] if isinstance(sources, str | Path) else list(sources)
    skills: dict[str, Skill] = {}
    for root in map(Path, roots):
        if not root.is_dir():
            raise ToolDefinitionError(f"skills: {root} is not a folder")
        folders = (
            [root]
            if (root / SKILL_FILE).is_file()
            else sorted(p for p in root.iterdir() if (p / SKILL_FILE).is_file())
        )
        for folder in folders:
            skill = read_skill(folder)
            if skill.name in skills:
                raise ToolDefinitionError(f"skills: two skills are named {skill.name}")
            skills[skill.name] = skill
    if not skills:
        raise ToolDefinitionError(f"skills: no {SKILL_FILE} in {', '.join(map(str, roots))}")
    return tuple(skills.values())


class LoadSkillArgs(ToolArgs):
    name: str = Field(max_length=64, description="The skill to load, by name")


class LoadedSkill(BaseModel):
    """A skill as the run loaded it (the state's `skills` channel): kept whole, so that a
    resumed run uses the version it loaded."""

    name: str
    version: str
    body: str
    programs: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, skill: Skill) -> LoadedSkill:
        return cls(name=skill.name, version=skill.version, body=skill.body, programs=skill.programs)


def _not_run_here(_ctx: ToolContext[Any], _args: Any, _key: str | None) -> dict[str, Any]:
    raise ToolFault("skill_action", "a skill is loaded by the loop, not as a tool")


class SkillLoaded(BaseModel):
    skill: str
    version: str
    programs: list[str]


@dataclass(frozen=True, eq=False)
class SkillContract(ToolContract):
    """The `load_skill` tool as the model is offered it, carrying the agent's skills. The loop
    loads a skill (`nodes.skills`); it never reaches the executor."""

    skills: tuple[Skill, ...] = ()

    def skill(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name), None)


def skill_contract(skills: tuple[Skill, ...]) -> SkillContract:
    names = ", ".join(s.name for s in skills)
    return SkillContract(
        name=SKILL_TOOL,
        description=(
            "Load one of your skills (working methods from your operator) by name; its method "
            f"is added to your instructions from the next step on. Skills: {names}."
        ),
        args_model=LoadSkillArgs,
        output_model=SkillLoaded,
        effect=Effect.READ,
        run=_not_run_here,
        skills=skills,
    )
