"""Program actions in the loop: a program's tool calls are the run's pending calls.

validate drives the run's program (`advance`). A `run_program` call of the model starts it in
the sandbox, up to its first tool call: the program, paused there (its snapshot), and that call
are committed together, the call still unchecked, and validate runs again to check it like any
call the model makes (a program's clock is the instant it started, so nothing the program does
after a commit depends on when a step runs). From then on, whenever the call the program waits
on has its answer (executed, refused by a check, rejected by an approver, settled by
reconcile), validate resumes the program from the committed snapshot with that answer: a
result, or an exception saying why the call was refused. It runs to its next tool call, which
is checked at once, or to its end, whose result (or exception) answers the `run_program` call:
the observation the model sees next. Every step between is the loop's own: approval, the
journaled executor, reconcile, each committed, so a crash anywhere resumes the program from its
last committed call, never running an earlier call again.

A program's calls are answered in the run's history like any call (a read's answer holds its
evidence), marked as the program's: the model is shown what the program returns, not each call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from langchain_core.messages import ToolMessage
from pydantic import ValidationError

from loopwright.core.protocol import ToolEnvelope, parse_tool_content
from loopwright.core.state import (
    Action,
    CallVerdict,
    Fact,
    PendingCall,
    RunState,
    canonical_json,
    digest,
)
from loopwright.core.views import tool_result
from loopwright.nodes.context import RunContext
from loopwright.tools import sandbox
from loopwright.tools.program import (
    PROGRAM_TOOL,
    ProgramCall,
    ProgramContract,
    ProgramRun,
    Programs,
    RunProgramArgs,
    inner_call_id,
)

# A refused call reaches the program as an exception of one of these types (by the refusal's
# code; RuntimeError otherwise), its message starting with the code.
EXCEPTIONS = {
    "permission_denied": "PermissionError",
    "out_of_scope": "PermissionError",
    "invalid_arguments": "ValueError",
    "unknown_tool": "NameError",
    "tool_not_allowed_now": "NameError",
}
# Facts an approver is shown about the program a call belongs to (labels of ApprovalRequest.facts).
PROGRAM_FACT = "Program call"
SOURCE_FACT = "Program source"
CALLS_FACT = "Program calls so far"

# Checks one new call as validate does: the call as checked, the actions it journaled, and its
# answer if it has one already (refused, or settled by the journal).
Check = Callable[[PendingCall], tuple[PendingCall, list[Action], ToolEnvelope | None]]


def offered(context: RunContext, tools: list[str]) -> Programs | None:
    """The agent's program declaration, if the model is offered programs now."""
    contract = context.tools.get(PROGRAM_TOOL)
    if isinstance(contract, ProgramContract) and PROGRAM_TOOL in tools:
        return contract.programs
    return None


def program_of(state: RunState) -> ProgramRun | None:
    raw = state.get("program")
    return ProgramRun.model_validate(raw) if raw else None


def allowed_in(programs: Programs, tools: list[str]) -> list[str]:
    """The tools a program's call may name now: declared for programs and offered now."""
    return [t for t in programs.tools if t in tools]


@dataclass
class Advance:
    """What validate's pass adds when it drives a program."""

    calls: list[PendingCall]
    answers: list[ToolMessage] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    program: ProgramRun | None = None


def _answer_in_history(state: RunState, call_id: str) -> ToolEnvelope | None:
    for message in reversed(state["history"]):
        if isinstance(message, ToolMessage) and message.tool_call_id == call_id:
            return parse_tool_content(str(message.content))
    return None


def _answer_to_program(envelope: ToolEnvelope) -> sandbox.Answer:
    if envelope.status == "ok":
        return sandbox.returns(envelope.result)
    error = envelope.error or {}
    code = str(error.get("code") or "error")
    message = f"{code}: {error.get('detail') or ''}".rstrip(": ")
    return sandbox.raises(EXCEPTIONS.get(code, "RuntimeError"), message)


def _end_envelope(
    step: sandbox.Finished | sandbox.Failed, run: ProgramRun, max_result_bytes: int
) -> ToolEnvelope:
    calls = [{"tool": c.tool, "outcome": c.code or c.outcome} for c in run.calls]
    printed = run.printed + step.printed
    if isinstance(step, sandbox.Finished):
        result = {"returned": step.value, "printed": printed, "calls": calls}
        size = len(canonical_json(result))
        if size <= max_result_bytes:
            return ToolEnvelope(status="ok", result=result)
        step = sandbox.Failed(
            "result_too_large", f"{size} bytes > cap {max_result_bytes}", step.printed
        )
    error = {"code": step.code, "detail": step.detail, "printed": printed, "calls": calls}
    return ToolEnvelope(status="error", error=error)


def program_facts(run: ProgramRun, call: PendingCall) -> tuple[Fact, ...]:
    """What an approver is told about the program a call belongs to: which of its calls this
    is, its source, and the calls it made before this one with their outcomes. The approver
    decides this one call, with its arguments, not the program."""
    number = next((i for i, c in enumerate(run.calls, 1) if c.call_id == call.call_id), 0)
    earlier = [c for c in run.calls if c.call_id != call.call_id]
    done = "; ".join(f"{c.tool} {c.code or c.outcome}" for c in earlier) or "none"
    what = f"call {number} of a program of this run ({run.call_id})"
    if run.skill:
        what += f", from skill {run.skill}"
    return (
        Fact(label=PROGRAM_FACT, value=what),
        Fact(label=SOURCE_FACT, value=run.source),
        Fact(label=CALLS_FACT, value=done),
    )


def _with_program_facts(call: PendingCall, run: ProgramRun) -> PendingCall:
    approval = call.approval
    if approval is None or any(f.label == PROGRAM_FACT for f in approval.facts):
        return call
    facts = (*approval.facts, *program_facts(run, call))
    return call.model_copy(update={"approval": approval.model_copy(update={"facts": facts})})


class _Driver:
    """One validate pass's work on the run's program."""

    def __init__(
        self, state: RunState, context: RunContext, programs: Programs | None, tools: list[str]
    ) -> None:
        # No programs: the agent offers them no more (a release without them, a specialist
        # that owns the run now): a running program ends at its next call's answer.
        self.state, self.context, self.programs = state, context, programs
        self.tools = allowed_in(programs, tools) if programs else []

    def source(self, args: RunProgramArgs) -> tuple[str, str | None]:
        """The program's source: its code, or a program file of a skill the run loaded (the
        version it loaded). Raises ValueError naming what is missing."""
        if args.code is not None:
            return args.code, None
        loaded = (self.state.get("skills") or {}).get(args.skill or "")
        if loaded is None:
            raise ValueError(f"skill {args.skill!r} is not loaded in this run: load it first")
        programs = loaded.get("programs") or {}
        if args.program not in programs:
            raise ValueError(f"skill {args.skill} has no program {args.program!r}")
        return programs[args.program], args.skill

    def start(
        self, call: PendingCall, now: datetime
    ) -> tuple[ProgramRun | None, ToolEnvelope | None]:
        """Run a new program to its first tool call. Returns the program (None if it never
        paused) and the answer to the run_program call if the program already ended."""
        assert self.programs is not None  # a program starts only where programs are offered
        try:
            args = RunProgramArgs.model_validate(call.args)
            code, skill = self.source(args)
        except ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors(include_url=False))
            error = {"code": "invalid_program", "detail": problems[:500]}
            return None, ToolEnvelope(status="error", error=error)
        except ValueError as exc:
            error = {"code": "invalid_program", "detail": str(exc)[:500]}
            return None, ToolEnvelope(status="error", error=error)
        run = ProgramRun(
            call_id=call.call_id,
            source=code,
            skill=skill,
            sandbox=sandbox.sandbox_version(),
            clock=now.isoformat(),
        )
        step = sandbox.start(
            code,
            tools=self.tools,
            limits=self.programs.limits,
            now=now,
            seed=digest([self.state["run_id"], call.call_id]),
            inputs=args.inputs,
        )
        return self.step(run, step)

    def step(self, run: ProgramRun, step: sandbox.Step) -> tuple[ProgramRun, ToolEnvelope | None]:
        """Record where a segment of the program ended: a new call it waits on, or its end."""
        if isinstance(step, sandbox.Paused):
            assert self.programs is not None  # a paused program was resumed where offered
            if len(run.calls) >= (limit := self.programs.max_calls):
                step = sandbox.Failed("call_limit", f"a program makes at most {limit} tool calls")
        if isinstance(step, sandbox.Paused):
            number = len(run.calls) + 1
            made = ProgramCall(
                call_id=inner_call_id(run.call_id, number), tool=step.tool, args=step.args
            )
            return run.model_copy(
                update={
                    "snapshot": step.snapshot,
                    "calls": [*run.calls, made],
                    "printed": (run.printed + step.printed)[-sandbox.MAX_PRINTED_CHARS :],
                }
            ), None
        ended = run.model_copy(update={"status": "ended", "snapshot": None})
        most = self.programs.max_result_bytes if self.programs else 0
        return ended, _end_envelope(step, run, most)

    def resume(
        self, run: ProgramRun, answer: ToolEnvelope
    ) -> tuple[ProgramRun, ToolEnvelope | None]:
        """Give the waiting call its answer and run the program to its next call or its end."""
        waiting, snapshot = run.waiting, run.snapshot
        assert waiting is not None and snapshot is not None
        error = answer.error or {}
        settled = waiting.model_copy(
            update={
                "args": {},
                "outcome": "ok" if answer.status == "ok" else "error",
                "code": None if answer.status == "ok" else str(error.get("code") or "error"),
            }
        )
        run = run.model_copy(update={"calls": [*run.calls[:-1], settled]})
        if self.programs is None:
            withdrawn = "the agent offers programs no more: the program was stopped at this call"
            return self.step(run, sandbox.Failed("program_withdrawn", withdrawn))
        try:
            sandbox.check_version(run.sandbox)
        except sandbox.SandboxChanged as exc:
            return self.step(run, sandbox.Failed("sandbox_changed", str(exc)))
        step = sandbox.resume(
            snapshot, _answer_to_program(answer), tools=self.tools, limits=self.programs.limits
        )
        return self.step(run, step)


def advance(
    state: RunState,
    context: RunContext,
    calls: list[PendingCall],
    answered: dict[str, ToolEnvelope],
    tools: list[str],
    check: Check,
) -> Advance | None:
    """Drive the run's program as far as the answers at hand let it (None: no program here).

    `calls` are the pending calls as this validate pass left them, `answered` the answers it
    gave (by call id): a call the pass refused is answered to the program in the same pass."""
    programs = offered(context, tools)
    run = program_of(state)
    running = run is not None and run.status == "running"
    starting = [c for c in calls if c.tool == PROGRAM_TOOL and c.verdict is None]
    if programs is None:
        starting = []  # a run_program call is then a call of no offered tool: refused
    if not (running or starting):
        return None
    driver = _Driver(state, context, programs, tools)
    out = Advance(calls=list(calls), program=run)
    for call in starting:
        if running:
            busy = {"code": "program_running", "detail": "one program runs at a time: wait for it"}
            _answer(out, call, ToolEnvelope(status="error", error=busy), CallVerdict.REJECTED)
            continue
        run, ended = driver.start(call, context.now())
        if ended is not None:
            _answer(out, call, ended, CallVerdict.DONE)
        if run is not None:
            out.program = run
            if ended is None:
                # Committed with the program before it is checked: see the module's docstring.
                waiting = run.waiting
                assert waiting is not None
                _replace(out, call.model_copy(update={"verdict": CallVerdict.RUNNING}))
                out.calls.append(_pending(waiting, run))
                running = True
    if out.program is not None and not starting:
        _resume(out, driver, state, answered, check)
    if out.program is not None:
        run = out.program
        out.calls = [
            _with_program_facts(c, run) if c.program == run.call_id else c for c in out.calls
        ]
    return out


def _pending(made: ProgramCall, run: ProgramRun) -> PendingCall:
    return PendingCall(call_id=made.call_id, tool=made.tool, args=made.args, program=run.call_id)


def _replace(out: Advance, call: PendingCall) -> None:
    out.calls = [call if c.call_id == call.call_id else c for c in out.calls]


def _answer(out: Advance, call: PendingCall, envelope: ToolEnvelope, verdict: CallVerdict) -> None:
    answered = call.model_copy(update={"verdict": verdict})
    _replace(out, answered)
    out.answers.append(tool_result(answered, envelope))


def _resume(
    out: Advance,
    driver: _Driver,
    state: RunState,
    answered: dict[str, ToolEnvelope],
    check: Check,
) -> None:
    """Resume the program while the call it waits on has a settled answer."""
    run = out.program
    while run is not None and (waiting := run.waiting) is not None:
        answer = answered.get(waiting.call_id) or _answer_in_history(state, waiting.call_id)
        if answer is None or answer.status == "unknown":
            break  # not answered yet, or not known yet: reconcile settles it first
        run, ended = driver.resume(run, answer)
        out.calls = [c for c in out.calls if c.call_id != waiting.call_id]
        if ended is not None:
            outer = next(c for c in out.calls if c.call_id == run.call_id)
            _answer(out, outer, ended, CallVerdict.DONE)
            break
        made = run.waiting
        assert made is not None
        checked, actions, refusal = check(_pending(made, run))
        out.calls.append(checked)
        out.actions.extend(actions)
        if refusal is not None:
            out.answers.append(tool_result(checked, refusal))
            answered[checked.call_id] = refusal
    out.program = run
