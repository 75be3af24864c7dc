"""loopwright installed from its wheel, hosting an application that is not the refund agent.

The runtime's wheel is built from this checkout and installed alone (not the reference agent's
distribution: the application needs nothing of it), not editable, into a fresh virtualenv. The
application (tests/outside_app, copied to a temp directory) has its own `tools` package,
`models.py` and `graph.py` -- the names loopwright used to install at the top level -- and
defines a booking desk against the public API only: a read, a write to a system without
idempotency keys (reconciled through a pre-image), and a write that is idempotent by key and
needs approval. Its business system is a real HTTP service on loopback. Everything runs from the
application's directory with the installed `loopwright` command, which finds the agent in the
application's pyproject.toml.

Each run ends verified, with exactly one booking and one confirmation in the business system:
after a booking whose answer never came (accept then time out), after a process killed at
`executor:after_send` and resumed by a new one, and after a crash right after the approved
confirmation was sent. The same application then runs under `loopwright serve`: a run through
langgraph-sdk, its approval decided in the inbox in Chromium, a second run cancelled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright import tls
from loopwright.processes import ChildProcess
from loopwright.reports import EXIT_CODES
from loopwright.server.bearer_tokens import hashed_table
from loopwright_refunds.scratch import fresh_database
from tests.ports import reserved_port
from tests.runtime_fixtures import PATIENCE_S, REPO, sdk_client, wait_for
from tests.test_inbox_browser import CHROMIUM, inbox_page

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("outside_app")
# Only this may land in site-packages (and the distribution's metadata).
TOP_LEVEL = {"loopwright"}
TOKENS = {
    "t-guest": {"user_id": "g-1", "roles": ["customer"]},
    "t-boss": {"user_id": "boss", "roles": ["approver"]},
}


@dataclass
class Installed:
    python: Path
    loopwright: Path
    site_packages: Path


# What a wheel is not built from (a build leaves build/ and *.egg-info in its source tree).
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", ".loopwright", "*.egg-info", "__pycache__", ".*_cache"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of this checkout (which the build would litter)."""
    source = tmp_path_factory.mktemp("source") / "loopwright"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE, symlinks=True)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(source), "-w", str(out)],
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("loopwright-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh virtualenv with the runtime's wheel and its dependencies (from the package
    index), and nothing else."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PATIENCE_S)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Installed(python, venv / "bin" / "loopwright", Path(site))


@pytest.fixture
def app(tmp_path: Path) -> Path:
    target = tmp_path / "desk-app"
    shutil.copytree(APP, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


class DeskService(ChildProcess):
    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        super().__init__(process)
        self.url = url

    def state(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{self.url}/admin/state", verify=tls.context()).json()
        return answer

    def arm(self, path: str, delay_s: float) -> None:
        httpx.post(
            f"{self.url}/admin/fault", json={"path": path, "delay_s": delay_s}, verify=tls.context()
        )


@pytest.fixture
def desk(installed: Installed, app: Path) -> Iterator[DeskService]:
    ready = app / "desk.url"
    command = ["-m", "desk.service", "--data", str(app / "data"), "--ready-file", str(ready)]
    process = subprocess.Popen(
        [str(installed.python), *command],
        cwd=app,
        stdin=subprocess.DEVNULL,
    )
    with DeskService(process, "") as service:
        wait_for(lambda: ready.exists() and ready.read_text().startswith("http"))
        service.url = ready.read_text()
        yield service


def outside(
    installed: Installed,
    app: Path,
    desk: DeskService,
    *args: str,
    timeout: float = PATIENCE_S,
    **env: str,
) -> Any:
    """`loopwright ARGS` from the application's directory, as its team would type it: on the
    embedded default database in the application's directory (never the test run's Postgres
    server, whose URL `DATABASE_URL` may hold: the tests create their own databases)."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "LOOPWRIGHT_AGENT", "DATABASE_URL")
    }
    environment |= {
        "DESK_URL": desk.url,
        "LOOPWRIGHT_HOME": str(app / ".loopwright"),
        "LOOPWRIGHT_LEASE_TTL_S": "2",  # a crashed run is resumed after 2 s, not 30
        **env,
    }
    return subprocess.run(
        [str(installed.loopwright), *args],
        cwd=app,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def approval_id(printed: str) -> str:
    [line] = [line for line in printed.splitlines() if "approvals approve" in line]
    return line.split("approvals approve ")[1].split()[0]


def test_the_wheel_installs_one_namespace(wheel: Path, installed: Installed) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == TOP_LEVEL
    assert "loopwright/server/inbox.html" in names  # what a non-editable install serves
    assert "loopwright/server/dev.py" in names  # what `serve` starts `langgraph dev` through
    assert not [n for n in names if "scratch" in n]  # the tests' throwaway databases stay out
    assert {p.name for p in installed.site_packages.iterdir()}.isdisjoint(
        {"graph", "nodes", "tools", "checkpoints", "models", "services", "server"}
    )


def test_the_runtime_installs_without_the_reference_agent_or_plots(installed: Installed) -> None:
    """`pip install loopwright` brings what runs and serves an agent; the reference agent and
    matplotlib (only its plots draw) come with `loopwright-refunds`."""
    found = subprocess.run(
        [
            str(installed.python),
            "-c",
            "import importlib.util as u;"
            " print([m for m in ('loopwright_refunds', 'matplotlib', 'numpy') if u.find_spec(m)])",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert found.stdout.strip() == "[]", found.stdout


def test_the_demo_without_the_reference_agent_says_how_to_get_it(
    installed: Installed, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPWRIGHT_AGENT")}
    demo = subprocess.run(
        [str(installed.loopwright), "demo", "--yes"],
        cwd=tmp_path,  # no pyproject.toml naming an agent
        env={**env, "LOOPWRIGHT_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=PATIENCE_S,
    )
    assert demo.returncode == 2, demo.stdout + demo.stderr
    [line] = demo.stderr.strip().splitlines()
    assert "the reference agent" in line and "pip install loopwright-refunds" in line, line
    assert not (tmp_path / "home").exists()  # nothing started, nothing written


def test_an_application_with_its_own_tools_models_and_graph_runs_from_its_directory(
    installed: Installed, app: Path, desk: DeskService
) -> None:
    """Accept then time out on the keyless booking: reconciled by the pre-image, never booked
    twice; then the confirmation waits for the boss, who approves it from another process."""
    desk.arm("/slots", 3.0)  # the booking is applied, its answer comes after the 1 s timeout
    started = outside(installed, app, desk, "run", "Book slot 1 for g-1.", "--user", "g-1")
    assert started.returncode == EXIT_CODES["waiting"], started.stderr
    assert "book RECONCILING" in started.stdout or "UNKNOWN" in started.stdout, started.stdout
    assert "WAITING_APPROVAL" in started.stdout
    listed = outside(installed, app, desk, "approvals", "list")
    assert approval_id(started.stdout) in listed.stdout
    approved = outside(
        installed, app, desk, "approvals", "approve", approval_id(started.stdout), "--as", "boss"
    )
    assert approved.returncode == 0, approved.stderr
    assert "COMPLETED" in approved.stdout and "booking_id bk_1" in approved.stdout
    assert desk.state() == {"bookings": [["1", "g-1"]], "confirmations": [["1", "g-1"]]}
    runs = outside(installed, app, desk, "runs")
    assert "desk 1" in runs.stdout


def test_a_crash_after_the_send_is_resumed_by_a_new_process_with_one_effect_per_intent(
    installed: Installed, app: Path, desk: DeskService
) -> None:
    crashed = outside(
        installed,
        app,
        desk,
        *("run", "Book slot 2 for g-1.", "--user", "g-1", "--run-id", "r-crash"),
        LOOPWRIGHT_CRASH_AT="executor:after_send",
    )
    assert crashed.returncode == 137, crashed.stderr
    assert desk.state()["bookings"] == [["2", "g-1"]]  # applied before the process died
    resumed = outside(installed, app, desk, "resume", "r-crash")
    assert resumed.returncode == EXIT_CODES["waiting"], resumed.stderr
    assert "WAITING_APPROVAL" in resumed.stdout
    # The approver's process dies right after the confirmation was sent, too.
    dying = outside(
        installed,
        app,
        desk,
        *("approvals", "approve", approval_id(resumed.stdout), "--as", "boss"),
        LOOPWRIGHT_CRASH_AT="executor:after_send",
    )
    assert dying.returncode == 137, dying.stderr
    done = outside(installed, app, desk, "resume", "r-crash")
    assert done.returncode == 0, done.stderr
    assert "COMPLETED" in done.stdout and "confirmation_id cf_1" in done.stdout
    assert desk.state() == {"bookings": [["2", "g-1"]], "confirmations": [["2", "g-1"]]}
    shown = outside(installed, app, desk, "show", "r-crash")
    assert shown.returncode == 0 and "UNKNOWN" in shown.stdout and "SUCCEEDED" in shown.stdout


def test_the_application_is_proven_under_every_fault_from_its_directory(
    installed: Installed, app: Path, desk: DeskService
) -> None:
    """`loopwright faults` on an agent of another shape: a keyless booking (queryable, no
    resend: an absent one goes to a person) and a keyed confirmation that needs approval.
    Every fault at each write, crashes included, leaves one effect per intent at most and no
    COMPLETED run with one missing."""
    # The lease's usual time to live, as a team runs it: its crash trials wait for none.
    proven = outside(installed, app, desk, "faults", "--json", LOOPWRIGHT_LEASE_TTL_S="30")
    assert proven.returncode == 0, proven.stdout + proven.stderr
    document = json.loads(proven.stdout)
    assert (document["agent"], document["held"], document["skipped"]) == ("desk", True, [])
    trials = {(t["tool"], t["fault"]): t for t in document["trials"]}
    network = ["request_lost", "answer_lost", "answer_late", "delivered_late"]
    crashes = ["crash_before_send", "crash_after_send"]
    assert list(trials) == [
        (None, None),
        *(("book", fault) for fault in [*network, *crashes]),  # no key: no duplicate delivery
        *(("confirm", fault) for fault in [*network, "duplicate", *crashes]),
    ]
    assert all(t["verdict"] == "ok" and t["reached"] for t in trials.values()), trials
    assert all(n <= 1 for t in trials.values() for n in t["effects"].values()), trials
    # A booking that never arrived is proven absent and handed to a person, not re-sent.
    lost = trials[("book", "request_lost")]
    assert (lost["stop_reason"], list(lost["effects"].values())) == ("needs_human", [0])
    assert "proven absent: a person decides" in lost["stop_detail"]
    assert trials[("confirm", "crash_after_send")]["stop_reason"] == "completed"


def test_a_run_of_this_agent_is_refused_by_another_agent(
    installed: Installed, app: Path, desk: DeskService
) -> None:
    started = outside(installed, app, desk, "run", "Book slot 3 for g-1.", "--user", "g-1")
    assert "WAITING_APPROVAL" in started.stdout, started.stdout + started.stderr
    [run_line] = [line for line in started.stdout.splitlines() if line.startswith("run ")]
    run_id = run_line.split()[1]
    other = "desk.agent:lookout"  # the application's other agent
    for command in (
        ("resume", run_id),
        ("cancel", run_id),
        ("show", run_id),
        ("approvals", "approve", approval_id(started.stdout), "--as", "boss"),
    ):
        refused = outside(installed, app, desk, *command, "--agent", other)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert desk.state()["confirmations"] == []


@pytest.mark.postgres
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"no Chromium at {CHROMIUM}")
def test_the_application_is_served_approved_in_the_inbox_and_cancelled(
    installed: Installed, app: Path, desk: DeskService, postgres_server_url: str
) -> None:
    with (
        reserved_port() as port,
        fresh_database(postgres_server_url, prefix="lw_test") as database_url,
    ):
        url = f"http://127.0.0.1:{port}"
        command = [str(installed.loopwright), "serve", "--port", str(port)]
        environment = {
            k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPWRIGHT_AGENT")
        }
        environment |= {
            "DESK_URL": desk.url,
            "DATABASE_URL": database_url,
            "LOOPWRIGHT_HOME": str(app / ".loopwright"),
            "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
        }
        serving = subprocess.Popen(
            command, cwd=app, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        with ChildProcess(serving):
            wait_for(lambda: _answers(url))
            guest = sdk_client(url=url, headers={"Authorization": "Bearer t-guest"})
            thread = guest.threads.create()["thread_id"]
            guest.runs.wait(thread, "loopwright", input={"task": "Book slot 4 for g-1."})
            [interrupt] = guest.threads.get_state(thread)["interrupts"]
            assert interrupt["value"]["tool"] == "confirm"

            with inbox_page(url, token="t-boss") as (_, page):
                page.get_by_role(
                    "button", name=f"Approve {interrupt['value']['approval_id']}"
                ).click()
                page.get_by_text("Approved").wait_for(timeout=PATIENCE_S * 1000)

            def finished() -> bool:
                values = guest.threads.get_state(thread)["values"]
                return isinstance(values, dict) and values.get("stop_reason") == "completed"

            wait_for(finished)
            assert desk.state() == {"bookings": [["4", "g-1"]], "confirmations": [["4", "g-1"]]}

            # A second run waits for the boss; its guest cancels it: nothing more is confirmed.
            second = guest.threads.create()["thread_id"]
            guest.runs.wait(second, "loopwright", input={"task": "Book slot 5 for g-1."})
            cancelled = outside(installed, app, desk, "cancel", second, "--db", database_url)
            assert cancelled.returncode == EXIT_CODES["incomplete"], cancelled.stderr
            assert "cancelled" in cancelled.stdout
            values = guest.threads.get_state(second)["values"]
            assert isinstance(values, dict) and values["stop_reason"] == "cancelled"
    assert desk.state()["confirmations"] == [["4", "g-1"]]


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ok", timeout=1, verify=tls.context()).status_code == 200
    except httpx.TransportError:
        time.sleep(0.2)
        return False
