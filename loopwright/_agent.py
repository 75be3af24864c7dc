"""`Agent`: what a team defines and loopwright hosts.

An agent is a name and version, instructions, tools (typed functions with their safety
declarations), the application's own dependencies, a model, a budget, and the answers to the
questions only the team can answer: whom a run acts for, which resources a task may touch, who
may approve. The runtime asks these through the agent and knows nothing else of the domain.

    desk = Agent("desk", instructions="Answer questions about tickets.", deps=open_desk)

    @desk.read(resources=lambda a: {f"ticket:{a.ticket_id}"})
    def get_ticket(ctx: ToolContext[Desk], args: TicketRef) -> Ticket:
        '''Read a ticket.'''
        return ctx.deps.tickets.get(args.ticket_id, timeout=ctx.timeout(5))

Entry points (`loopwright run --agent module:attribute`, the worker, the LangGraph server)
load an agent by import path, and a run records which agent and version it belongs to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Unpack, overload

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from loopwright.core.budget import Budget
from loopwright.core.plan import Planner
from loopwright.core.roles import DEFAULT_ROLES, Roles
from loopwright.core.state import DEFAULT_TENANT, Action, Principal
from loopwright.nodes.agents import AgentProfile, handoff_contract
from loopwright.tools.contract import (
    Effect,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    synchronous,
)
from loopwright.tools.define import function_contract
from loopwright.tools.langchain import langchain_contract
from loopwright.tools.options import ReadOptions, WriteOptions
from loopwright.tools.program import PROGRAM_TOOL, ProgramContract, Programs, program_contract
from loopwright.tools.registry import ToolRegistry
from loopwright.tools.skills import SKILL_TOOL, SkillContract, read_skills, skill_contract

AGENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # the whole name: `fullmatch`
# A model: a chat model, a spec ("openai:gpt-5-mini"), or a function that makes one (called
# once per process, so importing an agent never connects to anything).
ModelSource = BaseChatModel | str | Callable[[], BaseChatModel]


class TaskRefused(ValueError):
    """The agent does not take this task or user (an unknown user, a target that does not
    exist or is not theirs). Entry points report it in one line: exit 2, or a 4xx."""


@dataclass(frozen=True)
class Demo:
    """What `loopwright demo` runs for this agent: a task, the user it acts for, and who approves
    (answering every approval request, as a person at the terminal would)."""

    task: str
    user: str
    approver: str
    # The dependencies the demo runs on, if not the agent's own (e.g. fresh reference data).
    deps: Callable[[], AbstractContextManager[Any]] | None = None


@dataclass(frozen=True)
class Scenario:
    """A task `loopwright faults` proves the agent on: who asks, who approves (every request,
    as a person would), a fresh business world for each trial (`deps`, else the agent's own),
    the scripted model that plays it (`model`, else the agent's own), and how many effects an
    intent has in the business system (`effects(ctx, action, before)`, `before` being the
    pre-image journaled with its first send; else the write's own reconcile, which cannot see
    a second one). `env(deps)`: what a new process needs to reach the trial's world, for the
    crash trials' processes, which open the agent's own `deps` (e.g. the services' URLs)."""

    task: str
    user: str
    approver: str | None = None
    deps: Callable[[], AbstractContextManager[Any]] | None = None
    model: Callable[[], BaseChatModel] | None = None
    effects: Callable[[ToolContext[Any], Action, dict[str, Any] | None], int] | None = None
    env: Callable[[Any], Mapping[str, str]] | None = None


@contextlib.contextmanager
def _no_deps() -> Iterator[None]:
    yield None


Connection = Callable[[Sequence[ToolContract]], AbstractContextManager[object]]


@contextlib.contextmanager
def _opened[T](
    factory: Callable[[], AbstractContextManager[T]],
    connections: Mapping[Connection, Sequence[ToolContract]],
) -> Iterator[T]:
    """The tools' connections (each given the tools that use it), then the application's
    dependencies; closed in reverse."""
    with contextlib.ExitStack() as stack:
        for connection, contracts in connections.items():
            stack.enter_context(connection(contracts))
        yield stack.enter_context(factory())


# The functions of a scenario (or the demo) loopwright calls.
SCENARIO_HOOKS = ("deps", "model", "effects", "env")


def _no_boundary(_deps: Any, _principal: Principal, _task: str) -> Iterable[str]:
    return ()


Boundary = (
    Callable[[ToolContext[Any], str], Iterable[str]]
    | Callable[[Any, Principal, str], Iterable[str]]
)


def _boundary(given: Boundary) -> Callable[[Any, Principal, str], Iterable[str]]:
    """A boundary takes (ctx, task), ctx the tool context of the run to be (its deps and
    principal, as the tools get them), or (deps, principal, task); kept in the second form,
    which every entry point calls."""
    if len(inspect.signature(given).parameters) != 2:
        return given  # type: ignore[return-value]
    with_context: Callable[[ToolContext[Any], str], Iterable[str]] = given  # type: ignore[assignment]

    def boundary(deps: Any, principal: Principal, task: str) -> Iterable[str]:
        return with_context(ToolContext(deps=deps, principal=principal), task)

    return boundary


class Agent[DepsT]:
    """An agent loopwright can run: its identity, instructions, tools and rules.

    Every argument after `name` is a keyword. `instructions` become the trusted part of every
    model request (with the runtime's own rules, which come first). `deps` is a function that
    opens the application's dependencies as a context manager (HTTP clients, credentials): it
    is entered once per process and its value reaches every tool as `ctx.deps`. `model` is the
    default model of the agent's runs. `boundary(ctx, task)` (or `boundary(deps, principal,
    task)`) names the resources a
    task may touch (e.g. the tickets it names) and may refuse the task (`TaskRefused`); with no
    boundary a run may touch no declared resource at all. `principal(deps, user_id)` builds the
    trusted principal a run acts for (roles, tenant), refusing unknown users (default: the user
    with the agent's `roles.start` names). `approvers` says who may decide approvals: user ids,
    or `approvers(deps, user_id) -> bool`. `roles` names the roles of your identities (token
    table, JWT claim) that grant starting runs, deciding approvals and reading the metrics on a
    server, e.g. `Roles(start=("agent",), decide=("supervisor",), operate=("sre",))` (default:
    `customer`, `approver`, `operator`); a decider must also be an approver by `approvers`.
    `done(ctx, task, writes)` is the completion check: a run whose model gives its final answer
    ends COMPLETED only if every write it made is verified in the business system and the task
    is done. By default it is done when every write it planned happened; a team that knows what
    its tasks need says so (a booking owed but never made: not done; one a task did not need:
    done). `writes` holds each intent's latest action, with its status and outcome. Without
    it, a run whose writes were all refused by a rule (nothing succeeded) is not done either.
    `claims(ctx, answer, writes)` is the claim check: the effects the final answer claims that
    `writes` do not hold, in words (`["a booking of room 12"]`); an answer with one is fed back,
    then the run stops typed naming it, never COMPLETED.
    `shared()` opens what every process serving the agent must share when several do (e.g. a
    business service started locally, which two instances must not each start their own of)
    and yields the environment variables that point each process's `deps` at it:
    `loopwright serve` enters it once and gives its variables to its server (every instance).
    `scenarios` are the tasks `loopwright faults` proves the agent on (default: its `demo`).
    `health(deps)` names the agent's own dependencies that do not answer now (empty: all do),
    for readiness probes: a process serving the agent is not ready while any is named (or the
    hook raises, or takes longer than a probe's bound). Keep it quick: one cheap request each.
    `programs=Programs(tools=(...))` lets the model answer with a short program over the named
    tools (the `run_program` tool): each call it makes is checked, approved, journaled and
    reconciled like one the model makes itself (docs/programs.md). `skills` names folders of
    skills (a `SKILL.md` each, optional program files): the model sees their names and
    descriptions and loads one by name (the `load_skill` tool) as trusted operator material.

    The functions an agent and its tools declare, and what each is given (`ctx` is the call's
    `ToolContext`, `args` the tool's argument model, `action` an `Action` from the journal):

        boundary(ctx, task: str) -> Iterable[str]                         resources a task may touch
                                                      (or boundary(deps, principal, task))
        principal(deps, user_id: str) -> Principal                        whom a run acts for
        approvers(deps, user_id: str) -> bool                             who may decide
        health(deps) -> Iterable[str]                                     dependencies down now
        done(ctx, task: str, writes: list[Action]) -> bool                whether the task is done
        claims(ctx, answer: str, writes: list[Action]) -> list[str]       effects claimed, not held
        authorize(ctx, args) -> bool | None                               False refuses the call
        resources(args) -> Iterable[str]                                  what a call touches
        precondition(ctx, args) -> None                                   raises PreconditionFailed
        pre_image(ctx, args) -> dict                                      read before a keyless send
        reconcile(ctx, action[, pre_image: dict | None]) -> ReconcileResult
        verify(ctx, action) -> VerifyResult                               a succeeded write is there
        summary(args) -> str                                              the action in one line
        facts(args, evidence: Sequence[Evidence]) -> Iterable[tuple[str, str]]
        confirm(args) -> bool                                             approving takes two steps
        current_versions(ctx, args) -> dict[str, str]                     versions right before the send
        compensation(action) -> str                                       how to undo, offered to a person
        intent(run_id: str, args) -> str                                  the business intent key

    Verification, when the model answers: each succeeded write's `verify` asks the business
    system, except a write a later one replaces (its tool in the later write's `replaces`, on
    a resource both touch): that one is judged by its own recorded outcome, the later one is
    verified. Writes that only share a resource are each verified.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: str,
        version: str = "1",
        deps: Callable[[], AbstractContextManager[DepsT]] | None = None,
        model: ModelSource | None = None,
        tools: Iterable[ToolContract] = (),
        boundary: Boundary | None = None,
        principal: Callable[[DepsT, str], Principal] | None = None,
        approvers: Collection[str] | Callable[[DepsT, str], bool] = (),
        done: Callable[[ToolContext[DepsT], str, list[Action]], bool] | None = None,
        claims: Callable[[ToolContext[DepsT], str, list[Action]], list[str]] | None = None,
        budget: Budget | None = None,
        approval_ttl: timedelta = timedelta(hours=24),
        prompt_version: str | None = None,
        planner: Planner | None = None,
        specialists: Sequence[AgentProfile] = (),
        demo: Demo | None = None,
        shared: Callable[[], AbstractContextManager[Mapping[str, str]]] | None = None,
        scenarios: Sequence[Scenario] = (),
        health: Callable[[DepsT], Iterable[str]] | None = None,
        roles: Roles = DEFAULT_ROLES,
        programs: Programs | None = None,
        skills: str | Path | Sequence[str | Path] | None = None,
    ) -> None:
        if not AGENT_NAME.fullmatch(name):
            raise ToolDefinitionError(f"agent name {name!r}: lowercase letters, digits, _ and -")
        if not instructions.strip():
            raise ToolDefinitionError(f"agent {name}: give it instructions=...")
        if not isinstance(roles, Roles):
            raise ToolDefinitionError(
                f"agent {name}: roles={roles!r} is no Roles: give it"
                " roles=Roles(start=(...), decide=(...), operate=(...))"
            )
        hooks: dict[str, object] = {
            "deps": deps,
            "model": model,
            "boundary": boundary,
            "principal": principal,
            "approvers": approvers,
            "done": done,
            "claims": claims,
            "shared": shared,
            "health": health,
        }
        for number, scenario in enumerate([*scenarios, *([demo] if demo else [])]):
            where = "demo" if scenario is demo else f"scenarios[{number}]"
            hooks |= {f"{where}.{f}": getattr(scenario, f, None) for f in SCENARIO_HOOKS}
        for what, hook in hooks.items():
            if callable(hook) and not isinstance(hook, type | BaseChatModel):
                synchronous(f"agent {name}", what, hook)
        self.name = name
        self.version = version
        self.instructions = instructions.strip()
        self.deps_factory = deps
        self.model = model
        self.boundary_of = _boundary(boundary) if boundary is not None else None
        self.principal_of = principal
        self.roles = roles
        self.approvers = approvers
        self.done = done
        self.claims = claims
        self.budget = budget or Budget()
        self.approval_ttl = approval_ttl
        self._prompt_version = prompt_version
        self.prompt_version = prompt_version or f"{name}/{version}"
        self.planner = planner
        self.specialists = {profile.name: profile for profile in specialists}
        self.demo = demo
        self.shared = shared
        self.scenarios = tuple(scenarios)
        self.health = health
        handoffs = {handoff_contract(p).name: handoff_contract(p) for p in specialists}
        # What the team declared; the handoff tools of its specialists come with them.
        self._declared: list[ToolContract] = [
            c
            for c in tools
            if getattr(c, "name", None) not in handoffs
            and not isinstance(c, ProgramContract | SkillContract)
        ]
        self._contracts: list[ToolContract] = []
        for contract in [*self._declared, *handoffs.values()]:
            self._add(contract, declared=False)
        # Program actions (tools.program): the runtime's run_program tool, offered to the model
        # with the agent's own tools, carrying the declaration.
        self.programs = programs
        if programs is not None:
            self._add(program_contract(programs), declared=False)
        # Skills (tools.skills): folders read once, here; the runtime's load_skill tool.
        self.skills = skills
        if skills is not None:
            self._add(skill_contract(read_skills(skills)), declared=False)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, version={self.version!r}, tools={self.tools.names()})"

    # --- tools ---------------------------------------------------------------------------

    @overload
    def read[F: Callable[..., Any] | BaseTool](
        self, fn: F, /, **options: Unpack[ReadOptions]
    ) -> F: ...
    @overload
    def read[F: Callable[..., Any] | BaseTool](
        self, fn: None = None, /, **options: Unpack[ReadOptions]
    ) -> Callable[[F], F]: ...
    def read(self, fn: Any = None, /, **options: Unpack[ReadOptions]) -> Any:
        """Declare a read: `def f(ctx: ToolContext[Deps], args: Args) -> Output`, with the
        options of `ReadOptions`.

        A LangChain tool (`@tool`, `BaseTool`) may be passed instead of a function. Reads are
        retried on transport faults (`max_attempts`), bounded by `timeout_s` and the run's
        deadline, and their results are shown to the model as untrusted data. Every function
        given is a plain `def`: loopwright calls them from worker threads (an `async def` is
        refused).
        """
        return self._declare(fn, Effect.READ, options)

    @overload
    def write[F: Callable[..., Any] | BaseTool](
        self, fn: F, /, **options: Unpack[WriteOptions]
    ) -> F: ...
    @overload
    def write[F: Callable[..., Any] | BaseTool](
        self, fn: None = None, /, **options: Unpack[WriteOptions]
    ) -> Callable[[F], F]: ...
    def write(self, fn: Any = None, /, **options: Unpack[WriteOptions]) -> Any:
        """Declare a write: `def f(ctx: ToolContext[Deps], args: Args, intent_key: str) ->
        Output`, with the options of `WriteOptions` (`intent` required; a person approves
        unless `needs_approval` says otherwise; an unknown outcome goes to a person unless a
        `guarantee` and `reconcile` say how to learn it).

        A LangChain tool may be passed instead of a function, with the same options. Without
        `summary=`, an approver sees a call as its name and arguments (`restart: name web`).
        """

        return self._declare(fn, Effect.WRITE, options)

    def _declare(self, fn: Any, effect: Effect, options: Mapping[str, Any]) -> Any:
        """Add `fn` (a function or a LangChain tool) as a tool of `effect`, now or, used as a
        decorator with options only, when it is given."""

        def register(function: Any) -> Any:
            if isinstance(function, BaseTool):
                self._add(langchain_contract(function, effect, options))
            else:
                self._add(function_contract(function, effect, options))
            return function

        return register(fn) if fn is not None else register

    def add(self, *contracts: ToolContract) -> None:
        """Add tool contracts built elsewhere (`write_tool`, an `McpServer`'s declared tools).
        Every contract was checked when it was made, however it was made."""
        for contract in contracts:
            self._add(contract)

    def _add(self, contract: ToolContract, *, declared: bool = True) -> None:
        if not isinstance(contract, ToolContract):
            raise ToolDefinitionError(
                f"agent {self.name}: {contract!r} is no ToolContract (declare a function with"
                " agent.read / agent.write, or make its contract with read_tool / write_tool)"
            )
        if any(c.name == contract.name for c in self._contracts):
            raise ToolDefinitionError(f"agent {self.name}: a tool {contract.name} exists already")
        self._contracts.append(contract)
        if declared:
            self._declared.append(contract)

    def replace(self, **changes: Any) -> Agent[DepsT]:
        """A copy of this agent with some of its parts replaced, as keywords of `Agent(...)`
        (a test's model or budget, a variant with one more tool: `tools=[*agent.tools, t]`).
        A variant given other tools keeps the programs of the tools it still has."""
        parts: dict[str, Any] = {
            "name": self.name,
            "instructions": self.instructions,
            "version": self.version,
            "deps": self.deps_factory,
            "model": self.model,
            "tools": self._declared,
            "boundary": self.boundary_of,
            "principal": self.principal_of,
            "approvers": self.approvers,
            "done": self.done,
            "claims": self.claims,
            "budget": self.budget,
            "approval_ttl": self.approval_ttl,
            "prompt_version": self._prompt_version,
            "planner": self.planner,
            "specialists": list(self.specialists.values()),
            "demo": self.demo,
            "shared": self.shared,
            "scenarios": self.scenarios,
            "health": self.health,
            "roles": self.roles,
            "programs": self.programs,
            "skills": self.skills,
        }
        unknown = sorted(set(changes) - set(parts))
        if unknown:
            raise TypeError(f"Agent has no part {', '.join(unknown)}")
        if "tools" in changes and "programs" not in changes and self.programs is not None:
            # Programs call what the variant still has (none left: it offers no programs).
            names = {getattr(c, "name", None) for c in changes["tools"]}
            kept = tuple(t for t in self.programs.tools if t in names)
            parts["programs"] = dataclasses.replace(self.programs, tools=kept) if kept else None
        return Agent(**(parts | changes))

    @property
    def tools(self) -> ToolRegistry:
        return ToolRegistry(self._contracts)

    def check(self) -> None:
        """Refuse an agent that cannot run safely, saying what to add (entry points call it)."""
        names = {c.name for c in self._contracts}
        for contract in self._contracts:
            if unknown := sorted(set(contract.replaces) - names):
                raise ToolDefinitionError(
                    f"tool {contract.name}: replaces names {', '.join(unknown)}, which agent "
                    f"{self.name} does not have"
                )
        if self.programs is not None:
            callable_ = sorted(set(self.programs.tools) - (names - {PROGRAM_TOOL, SKILL_TOOL}))
            if callable_:
                raise ToolDefinitionError(
                    f"agent {self.name}: Programs(tools=...) names {', '.join(callable_)}, which"
                    " are not tools of the agent a program can call"
                )
        touching = sorted(c.name for c in self._contracts if c.declares_resources)
        if self.boundary_of is None and touching:
            raise ToolDefinitionError(
                f"agent {self.name}: {', '.join(touching)} declare resources, but the agent "
                "declares no boundary=...: say which resources a task may touch, e.g. "
                "boundary=lambda deps, principal, task: {'ticket:T-1'}"
            )

    # --- what entry points ask -------------------------------------------------------------

    def open_deps(self) -> AbstractContextManager[DepsT]:
        """The application's dependencies for this process, as a context manager, with what the
        agent's tools' calls go through opened first (each MCP server's session, whose listing
        is checked against the tools declared on it: a mismatch is refused here, in one line)."""
        factory = self.deps_factory or _no_deps
        users: dict[Connection, list[ToolContract]] = {}
        for contract in self._contracts:
            if contract.connection is not None:
                users.setdefault(contract.connection, []).append(contract)
        return _opened(factory, users)  # type: ignore[arg-type]

    def chat_model(self, spec: str | None = None) -> BaseChatModel:
        """The model a run uses: `spec` ("openai:<model>") if given, else the agent's own."""
        from loopwright.models.factory import make_model  # the OpenAI client is slow to import

        source = spec or self.model
        if source is None:
            raise TaskRefused(
                f"agent {self.name} declares no model: give it model=..., or --model openai:<name>"
            )
        if isinstance(source, BaseChatModel):
            return source
        if isinstance(source, str):
            return make_model(source)
        return source()

    def principal_for(
        self, deps: DepsT, user_id: str, task: str, *, tenant: str = DEFAULT_TENANT
    ) -> Principal:
        """The trusted principal of a new run of `task` for `user_id` of `tenant` (the trusted
        caller's word, like the user id), scoped to the task's boundary. Raises TaskRefused for
        a user or task the agent does not take."""
        if self.principal_of is not None:
            principal = self.principal_of(deps, user_id).model_copy(update={"tenant": tenant})
        else:  # whoever the trusted caller names, in the roles that start runs
            principal = Principal(user_id=user_id, tenant=tenant, roles=self.roles.start)
        boundary = self.boundary_of or _no_boundary
        scope = tuple(sorted(set(boundary(deps, principal, task))))
        return principal.model_copy(update={"scope": scope})

    def is_approver(self, deps: DepsT, user_id: str) -> bool:
        if callable(self.approvers):
            return bool(self.approvers(deps, user_id))
        return user_id in self.approvers
