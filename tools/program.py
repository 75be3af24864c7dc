"""Program actions: what an agent declares to let its model answer with a program.

`Programs(tools=(...))` offers the model a runtime tool, `run_program`, whose argument is a
short Python program over the named tools (CodeAct). The program runs in the sandbox
(`tools.sandbox`); each call it makes is a pending call of the run that goes through validate,
approval, the journaled executor and reconcile like any call the model makes itself, and
what the program returns (or raises) is the observation the model sees next. The loop's side
of it is `nodes.program`.

A paused program is recorded in the run's state as a `ProgramRun`: its source, the sandbox
that paused it, the paused sandbox itself (bytes, bounded), the call it waits on and every call
it made so far with its outcome: what the timeline, the traces and an approver see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from loopwright.tools.contract import Effect, ToolArgs, ToolContext, ToolContract, ToolFault
from loopwright.tools.sandbox import SandboxLimits

PROGRAM_TOOL = "run_program"
MAX_SOURCE_CHARS = 20_000


@dataclass(frozen=True)
class Programs:
    """An agent's program actions: the tools a program may call (each call still checked,
    approved where its tool asks for it, journaled and reconciled), the sandbox's limits for
    one program, how many tool calls one program may make, and how large its result may be."""

    tools: tuple[str, ...]
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    max_calls: int = 50
    max_result_bytes: int = 16_000

    def __post_init__(self) -> None:
        if isinstance(self.tools, str) or not self.tools:
            raise ValueError("Programs(tools=(...)): name the tools a program may call")
        object.__setattr__(self, "tools", tuple(self.tools))
        if self.max_calls < 1 or self.max_result_bytes < 1:
            raise ValueError("Programs: max_calls and max_result_bytes must be > 0")


class RunProgramArgs(ToolArgs):
    """A program: its source (`code`), or a program file of a skill the run loaded (`skill` and
    `program`), and the values it starts with (`inputs`, bound as global names)."""

    code: str | None = Field(
        default=None,
        max_length=MAX_SOURCE_CHARS,
        description="The Python program. Its last expression is its result.",
    )
    skill: str | None = Field(default=None, description="A loaded skill whose program to run")
    program: str | None = Field(default=None, description="The skill's program file, e.g. run.py")
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="Values the program starts with, as global names"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RunProgramArgs:
        if (self.code is None) == (self.skill is None or self.program is None):
            raise ValueError("give either code, or skill and program")
        if not all(name.isidentifier() for name in self.inputs):
            raise ValueError("each input is named as a Python name")
        return self


class ProgramResult(BaseModel):
    returned: Any = None
    printed: str = ""


def describe(programs: Programs) -> str:
    names = ", ".join(programs.tools)
    example = f"`result = {programs.tools[0]}(name=value)`"
    return (
        "Run a short Python program instead of one tool call, when the work needs loops, "
        f"branches or filtering over several calls. The program may call these tools as "
        f"functions, with keyword arguments only: {names}; e.g. {example}. A call returns the "
        "tool's result as a dict, or "
        "raises an exception whose message starts with the refusal's code (a write refused "
        "by a rule, or rejected by an approver, raises; an approval is asked for each write "
        "that needs one, and the program waits). Each call is checked and journaled like one "
        "you make yourself: never repeat a call that succeeded. There is no file, network, "
        "environment or import beyond json, re, math, decimal and datetime. The program's last "
        f"expression is its result (JSON data). At most {programs.max_calls} tool calls."
    )


def _not_run_here(_ctx: ToolContext[Any], _args: Any, _key: str | None) -> dict[str, Any]:
    raise ToolFault("program_action", "a program is run by the loop, not as a tool")


@dataclass(frozen=True, eq=False)
class ProgramContract(ToolContract):
    """The `run_program` tool as the model is offered it, carrying the agent's declaration. The
    loop runs it (`nodes.program`); it never reaches the executor."""

    programs: Programs = field(default_factory=lambda: Programs(tools=("_",)))


def program_contract(programs: Programs) -> ProgramContract:
    return ProgramContract(
        name=PROGRAM_TOOL,
        description=describe(programs),
        args_model=RunProgramArgs,
        output_model=ProgramResult,
        effect=Effect.READ,
        run=_not_run_here,
        programs=programs,
    )


CallOutcome = Literal["waiting", "ok", "error"]


class ProgramCall(BaseModel):
    """One tool call a program made: its call id in the run, the tool, where it stands
    (`waiting` for its answer, `ok`, `error` with the refusal's code), and while it waits its
    arguments (the pending call's; once it is answered the run's history and journal hold what
    it did, and the program's record stays small at every call it commits)."""

    call_id: str
    tool: str
    args: dict[str, Any]
    outcome: CallOutcome = "waiting"
    code: str | None = None


class ProgramRun(BaseModel):
    """A program action of the run (the state's `program` channel). `snapshot` is the paused
    program while it waits on a call (None once it ended), `sandbox` the sandbox version that
    paused it, `clock` the instant its clock reads, `status` running or ended."""

    call_id: str
    source: str
    skill: str | None = None
    sandbox: str
    clock: str
    status: Literal["running", "ended"] = "running"
    snapshot: str | None = None
    calls: list[ProgramCall] = Field(default_factory=list)
    printed: str = ""

    @property
    def waiting(self) -> ProgramCall | None:
        if self.status != "running" or not self.calls or self.calls[-1].outcome != "waiting":
            return None
        return self.calls[-1]


def inner_call_id(program_call_id: str, number: int) -> str:
    """The run's call id of a program's `number`-th tool call (from 1): deterministic, so a
    step run again after a crash makes the same call, under the same id."""
    return f"{program_call_id}:p{number}"
