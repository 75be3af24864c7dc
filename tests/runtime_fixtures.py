"""Fixtures for driving whole runs: fresh reference services and an in-process runner."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import PregelTask
from langgraph_sdk.client import SyncLangGraphClient

from loopwright import Agent, AgentProfile, Budget, Planner, ToolContract
from loopwright.attempt import process_owner
from loopwright.checkpoints.leases import open_lease_store
from loopwright.core import tls
from loopwright.core.crashpoints import EXIT_CODE as CRASH_EXIT
from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import (
    ApprovalChoice,
    ApprovalDecision,
    ApprovalRequest,
    Principal,
    RunState,
)
from loopwright.graph.build import NODES
from loopwright.models.factory import make_model
from loopwright.models.openai_chat import (
    API_ENV,
    REASONING_ENV,
    RETRIES_ENV,
    STREAM_ENV,
    TIMEOUT_ENV,
)
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner, open_runner
from loopwright_refunds.agent import RefundServices, connect, task_scope
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.orders import SEED_ORDERS
from tests import cli_forkserver
from tests.openai_server import MODEL, ModelFactory, OpenAIStub
from tests.services_host import ServicesHost

REPO = Path(__file__).resolve().parent.parent
DEMO_TASK = "Check whether order O-42 can be refunded and refund it if so."
# Model calls of the uncrashed demo: get_order, get_policy, submit_refund, get_refund_status, answer.
UNCRASHED_MODEL_CALLS = 5


@pytest.fixture(scope="session")
def services_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServicesHost]:
    """The process that serves each test of this pytest process its own services
    (`tests.services_host`): started once, not once per test."""
    with ServicesHost(tmp_path_factory.mktemp("services-host") / "host.log") as host:
        yield host


@pytest.fixture
def services(services_host: ServicesHost, tmp_path: Path) -> Iterator[ServiceEndpoints]:
    """The reference services on fresh storage: every test starts from the seeded orders.
    A test that kills or restarts them starts its own (`start_services`)."""
    with services_host.serving(tmp_path / "services") as endpoints:
        yield endpoints


RunnerFactory = Callable[..., AbstractContextManager[Runner]]


def refund_agent(
    tools: Iterable[ToolContract] | None = None,
    planner: Planner | None = None,
    agents: dict[str, AgentProfile] | None = None,
) -> Agent[RefundServices]:
    """The reference agent, with other tools, a planner or specialists where a test says."""
    changes: dict[str, Any] = {}
    if tools is not None:
        changes["tools"] = list(tools)
    if planner is not None:
        changes["planner"] = planner
    if agents is not None:
        changes["specialists"] = list(agents.values())
    return refunds.replace(**changes) if changes else refunds


@contextmanager
def _runner(
    database_url: str, endpoints: ServiceEndpoints, agent: Agent[Any], **options: Any
) -> Iterator[Runner]:
    with connect(endpoints) as deps, open_runner(database_url, agent, deps=deps, **options) as r:
        yield r


@pytest.fixture
def open_test_runner(database_url: str, services: ServiceEndpoints) -> RunnerFactory:
    """Open a runner of the reference agent (or of a variant) on the test's database and
    services."""

    def factory(
        model: BaseChatModel | None = None,
        budget: Budget | None = None,
        tools: Iterable[ToolContract] | None = None,
        planner: Planner | None = None,
        agents: dict[str, AgentProfile] | None = None,
        agent: Agent[Any] | None = None,
    ) -> AbstractContextManager[Runner]:
        hosted = agent or refund_agent(tools, planner, agents)
        return _runner(database_url, services, hosted, model=model, budget=budget)

    return factory


def principal(user_id: str = "u-1", task: str = DEMO_TASK) -> Principal:
    return Principal(user_id=user_id, scope=task_scope(task))


def decide(
    outcome: RunOutcome, decision: Literal["approve", "reject"] = "approve", approver: str = "a-1"
) -> dict[str, Any]:
    """The resume value answering the run's (first) pending approval request."""
    request = outcome.waiting_for_approval[0]
    return ApprovalDecision(
        approval_id=request["approval_id"],
        digest=request["digest"],
        decision=decision,
        approver=approver,
    ).model_dump(mode="json")


def answered(
    request: dict[str, Any],
    decision: ApprovalChoice,
    approver: str,
    comment: str = "",
    *,
    changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The resume value a decision on `request` is (`ApprovalRequest.answer`), sent to the run
    straight, past the checks `Runner.decide` makes first."""
    answer = ApprovalRequest.model_validate(request).answer(decision, approver, comment, changes)
    return answer.model_dump(mode="json")


def approve(runner: Runner, outcome: RunOutcome, approver: str = "a-1") -> RunOutcome:
    return runner.resume(outcome.run_id, decide(outcome, "approve", approver))


def history_steps(runner: Runner, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """A run's node steps as LangGraph's history shows them, every checkpoint rebuilt, a
    specialist's from its subgraph's own history, in the order their checkpoints were made:
    what `Runner.steps` must equal, however it reads them."""
    db = runner.leases.db
    namespaces = [
        row["checkpoint_ns"]
        for row in db.execute(
            "SELECT checkpoint_ns FROM lw_checkpoints WHERE thread_id = %s"
            " UNION SELECT checkpoint_ns FROM checkpoints WHERE thread_id = %s",
            (run_id, run_id),
        )
    ]
    found: list[tuple[str, PregelTask]] = []
    for ns in namespaces:
        config: RunnableConfig = {"configurable": {"thread_id": run_id, "checkpoint_ns": ns}}
        for snapshot in runner.graph.get_state_history(config):
            steps = NODES if ns else (*NODES, "handoff")
            found += [
                (snapshot.config["configurable"]["checkpoint_id"], task)
                for task in snapshot.tasks
                if task.name in steps and task.result is not None
            ]
    found.sort(key=lambda pair: pair[0])
    return [(task.name, task.result or {}) for _, task in found]


# How long a test waits for something that is bound to happen (a process to answer or exit, a
# run to end, a condition to hold): only a hang takes this long. A loaded machine (CI's two
# cores running three test processes, or other jobs beside them) makes every step many times
# slower than a quiet one; no test fails because something took long, only because it never came.
PATIENCE_S = 600.0
# How long something took, as progress lines print it (`12s`, `4m10s`, `1h02m`, see
# `loopwright_refunds.experiments.progress.duration`): a test reads the line whatever it says.
DURATION = r"(?:\d+h\d{2}m|\d+m\d{2}s|\d+s)"

BACKENDS = ("sqlite", "postgres")


def on_backend(backend: str, *values: object) -> Any:
    """A case of a test parametrised with `database_url` (indirect) last: `values`, then
    `backend`, marked `postgres` when it needs Postgres. For cases that differ in what the
    database never sees, run each on one backend in turn rather than on both."""
    marks = [pytest.mark.postgres] if backend == "postgres" else []
    return pytest.param(*values, backend, marks=marks)


def wait_for(
    predicate: Callable[[], object],
    timeout: float = PATIENCE_S,
    *,
    said: Callable[[], str] | None = None,
) -> None:
    """Poll `predicate` until it holds; fail the test if it has not within `timeout` seconds,
    with what `said` tells of where things stand then."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(
                "condition not met in time" + (f"; {said()}" if said is not None else "")
            )
        time.sleep(0.05)


def sdk_client(
    url: str, headers: dict[str, str] | None = None, timeout: float | None = None
) -> SyncLangGraphClient:
    """The LangGraph SDK's client of the server at `url`, as `get_sync_client` makes it (five
    connection retries, the SDK's timeouts unless `timeout`), on the process's TLS roots."""
    http = httpx.Client(
        base_url=url,
        headers=headers,
        transport=httpx.HTTPTransport(retries=5, verify=tls.context()),
        timeout=httpx.Timeout(timeout) if timeout else httpx.Timeout(5, read=300, write=300),
    )
    return SyncLangGraphClient(http)


def tool_errors(state: RunState) -> list[dict[str, Any]]:
    """The structured errors the model was given as tool results, in order."""
    envelopes = [parse_tool_content(m.text) for m in state["history"] if isinstance(m, ToolMessage)]
    return [e.error or {} for e in envelopes if e.status == "error"]


def final_answer(state: RunState) -> str:
    """The model's last word: a plain answer, no tool call."""
    last = state["history"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls, last
    return last.text


def all_refunds(services: ServiceEndpoints) -> list[dict[str, Any]]:
    """Every refund the payments service holds for any seeded order: the ground truth of effects."""
    return [r for order_id, *_ in SEED_ORDERS for r in list_refunds(services, order_id)]


def cli(
    *args: str,
    env: dict[str, str],
    expect: int | None = None,
    timeout: float = PATIENCE_S,
    cwd: Path = REPO,
) -> cli_forkserver.Finished:
    """Run `loopwright ARGS` in a new process, as a user would, without a terminal on stdin,
    in `cwd` (an application's directory); with `expect`, fail unless it exits with that code
    (`loopwright.reports.EXIT_CODES`). The process is forked from a server that has imported
    what every command imports (`tests.cli_forkserver`), not started from scratch."""
    result = cli_forkserver.shared().run(
        list(args),
        env=_cli_env(env),
        cwd=cwd,
        timeout=timeout,
    )
    if expect is not None and result.returncode != expect:
        raise AssertionError(
            f"loopwright {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def _cli_env(env: dict[str, str]) -> dict[str, str]:
    """A command's environment: this process's, the checkout importable, and `env` on top."""
    return {**os.environ, "PYTHONPATH": str(REPO), **env}


def start_cli(
    *args: str,
    env: dict[str, str],
    stdout: int = subprocess.DEVNULL,
    stderr: int = subprocess.DEVNULL,
    cwd: Path = REPO,
) -> cli_forkserver.Started:
    """Start `loopwright ARGS` as `cli` runs it, and return while it runs (a worker, a command
    the test signals or reads as it goes), as `subprocess.Popen` would: see
    `cli_forkserver.Started`."""
    return cli_forkserver.shared().start(
        list(args),
        env=_cli_env(env),
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        timeout=PATIENCE_S,
    )


def release_crashed(crashed: cli_forkserver.Finished, database_url: str, run_id: str) -> None:
    """Check that `crashed` is a command's process that stopped at its armed crash point, and
    give up the lease it held on `run_id` (`LeaseStore.release_for_dead`, as `loopwright faults`
    does): it was reaped, it renews and writes nothing more. The next process need not wait out
    the lease's usual time to live, and no test needs a short one, which a command held up on a
    loaded machine would lose while it still works."""
    assert crashed.returncode == CRASH_EXIT, crashed.stdout + crashed.stderr
    with open_lease_store(database_url) as leases:
        leases.release_for_dead(run_id, process_owner(crashed.pid))


@pytest.fixture(scope="session", autouse=True)
def _stop_cli_forkserver() -> Iterator[None]:
    """Stop this process's command-line server, if a test started it."""
    yield
    cli_forkserver.stop_shared()


@pytest.fixture
def openai_stub() -> Iterator[OpenAIStub]:
    """A running stub playing the refund procedure; tests may swap `policy` or script faults."""
    with OpenAIStub().serving() as stub:
        yield stub


@pytest.fixture
def openai_model(openai_stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch) -> ModelFactory:
    """Build the runtime's production model (`make_model("openai:...")`) pointed at the stub,
    configured only through the environment, as an operator would configure it."""

    def factory(
        api: str = "responses",
        *,
        stream: bool = False,
        retries: int = 2,
        reasoning: str = "low",
        timeout_s: float | None = None,
    ) -> BaseChatModel:
        env = {
            "OPENAI_BASE_URL": openai_stub.url,
            "OPENAI_API_KEY": "sk-test",
            API_ENV: api,
            STREAM_ENV: "1" if stream else "0",
            RETRIES_ENV: str(retries),
            REASONING_ENV: reasoning,
            TIMEOUT_ENV: "" if timeout_s is None else str(timeout_s),
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return make_model(f"openai:{MODEL}")

    return factory
