"""The README's walkthroughs, on the pages it leads to, as a user follows them in a fresh clone
after `make demo`.

In a directory of its own, on the embedded default (SQLite, the reference services the commands
start themselves): the demo, then each shell walkthrough (docs/cli.md's `--json` script,
docs/faults.md's crash), then `loopwright serve` on Postgres with docs/serving.md's SDK example
run against it, and its production recipe. Each walkthrough uses an order of its own, so one
never finds its order already refunded by another, whatever order they are read in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright import tls
from loopwright.reports import EXIT_CODES
from loopwright.server import cluster
from loopwright.server.bearer_tokens import hashed_table
from loopwright_refunds.scratch import fresh_database
from tests import docs_pages
from tests.ports import reserved_port, reserved_ports
from tests.runtime_fixtures import PATIENCE_S, REPO, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# The shell walkthroughs, by their page and a line each contains, in the order the test runs them.
WALKTHROUGHS = (
    ("docs/cli.md", "--json > run.json"),
    ("docs/faults.md", "LOOPWRIGHT_CRASH_AT=executor:after_send"),
)
SERVING = "docs/serving.md"
DEMO_ORDER = "O-42"
ORDER = re.compile(r"\bO-\d+\b")


def walkthrough(page: str, marker: str) -> str:
    return docs_pages.block_with(page, "sh", marker)


def sdk_example() -> str:
    """docs/serving.md's SDK example, under "Start the server (offline)"."""
    [block] = docs_pages.blocks(SERVING, "python", "Start the server (offline)")
    assert "get_sync_client" in block
    return block


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell: the installed `loopwright` on PATH, no DATABASE_URL, nothing of the
    test run's home. Leases of 6 s, so the crash walkthrough's resume waits 6 s, not 30; not
    shorter: a command renews its lease every third of that, and one a loaded machine holds up
    for longer than the lease loses its run while it still works."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LOOPWRIGHT"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["LOOPWRIGHT_LEASE_TTL_S"] = "6"
    return env


def sh(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=PATIENCE_S,
    )


@pytest.fixture
def served(
    postgres_server_url: str, tmp_path: Path, user_env: dict[str, str]
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`loopwright serve --port P` in the user's directory, on a Postgres database of its own."""
    with fresh_database(postgres_server_url, prefix="lw_test") as url, reserved_port() as port:
        process = subprocess.Popen(
            ["loopwright", "serve", "--port", str(port)],
            cwd=tmp_path,
            env={**user_env, "DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: process.poll() is not None or reachable(base))
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            yield base, process
        finally:
            process.terminate()
            process.wait(timeout=PATIENCE_S)


def reachable(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ok", timeout=2, verify=tls.context()).status_code == 200
    except httpx.TransportError:
        return False


def test_each_walkthrough_works_on_an_order_of_its_own() -> None:
    """What lets a user follow them in any order after the demo: no two touch one order."""
    orders = [
        set(ORDER.findall(code))
        for code in (*(walkthrough(*w) for w in WALKTHROUGHS), sdk_example())
    ]
    assert all(len(named) == 1 for named in orders), orders
    assert len(set.union(*orders) | {DEMO_ORDER}) == len(orders) + 1, orders


def test_the_walkthroughs_run_after_the_demo(tmp_path: Path, user_env: dict[str, str]) -> None:
    demo = sh("loopwright demo --yes", tmp_path, user_env)
    assert demo.returncode == EXIT_CODES["completed"], demo.stdout + demo.stderr

    scripted = sh(walkthrough(*WALKTHROUGHS[0]), tmp_path, user_env)
    assert scripted.stdout.strip().splitlines()[-1] == "completed", scripted.stderr

    crashed = sh(walkthrough(*WALKTHROUGHS[1]), tmp_path, user_env)
    assert crashed.returncode == EXIT_CODES["completed"], crashed.stdout + crashed.stderr
    shown = sh("loopwright show crash-1 --json", tmp_path, user_env)
    history = json.loads(shown.stdout)
    assert history["stop_reason"] == "completed"
    [action] = history["actions"]
    assert action["status"] == "SUCCEEDED" and action["args"]["order_id"] == "O-43"

    # Each walkthrough found its own order untouched: one refund per order, none twice.
    listed = json.loads(sh("loopwright runs --json", tmp_path, user_env).stdout)
    assert len(listed["runs"]) == 3


def test_the_sdk_example_against_loopwright_serve(
    served: tuple[str, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = served
    namespace: dict[str, Any] = {}
    exec(
        compile(sdk_example().replace("http://127.0.0.1:2024", base), SERVING, "exec"),
        namespace,
    )
    final = namespace["ann"].threads.get_state(namespace["thread"]["thread_id"])["values"]
    assert (final["phase"], final["stop_reason"]) == ("COMPLETED", "completed")
    assert final["verification"]["verified"] is True
    # What it prints: the run's ending, then the refund it made, with the refund's id.
    ending, refund = capsys.readouterr().out.splitlines()
    assert ending == "COMPLETED completed"
    assert re.fullmatch(r"Refund 120\.00 USD to order O-47 \{'refund_id': 'rf_\w+'\}", refund)


def production_recipe() -> str:
    return docs_pages.block_with(SERVING, "sh", "--engine aegra")


def redis_url() -> str | None:
    """The Redis the production recipe runs on, if this machine has one."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    return None if cluster.redis_unreachable(url) else url


@pytest.mark.skipif(
    importlib.util.find_spec("aegra_api") is None, reason="the aegra extra is not installed"
)
def test_the_production_recipe_serves_approvals_across_its_instances(
    postgres_server_url: str, tmp_path: Path, user_env: dict[str, str]
) -> None:
    """docs/serving.md's production recipe as written (its `pip install` aside: installed already),
    on a database of its own: the SDK example's customer on one instance, its approver on the
    other; then the deployment stops with its command, instances and all."""
    redis = redis_url()
    if redis is None:
        pytest.skip("no Redis on this machine")
    recipe = "\n".join(
        line for line in production_recipe().splitlines() if not line.startswith("pip install")
    )
    # The development table's users, stored as production stores them: hashed.
    dev_table = json.loads((REPO / "loopwright/server/dev-tokens.json").read_text())
    (tmp_path / "tokens.json").write_text(json.dumps(hashed_table(dev_table)))
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(postgres_server_url, prefix="lw_test"))
        # The deployment is gone for good with its database: so are its keys (queue, markers).
        stack.callback(cluster.forget_keys, redis, cluster.deployment_prefix(url))
        port = stack.enter_context(reserved_ports(2))
        recipe = re.sub(r"DATABASE_URL=\S+", f"DATABASE_URL={url}", recipe)
        recipe = re.sub(r"REDIS_URL=\S+", f"REDIS_URL={redis}", recipe)
        recipe = recipe.replace("--port 2031", f"--port {port}")
        # `exec`: the command is the shell's process, which the test stops as a user would.
        recipe = recipe.replace("\nloopwright serve", "\nexec loopwright serve")
        process = subprocess.Popen(
            ["bash", "-c", recipe],
            cwd=tmp_path,
            env=user_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        first, second = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
        try:
            wait_for(lambda: process.poll() is not None or reachable_aegra(second))
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            example = sdk_example().replace("http://127.0.0.1:2024", first, 1)
            namespace: dict[str, Any] = {}
            exec(
                compile(example.replace("http://127.0.0.1:2024", second), SERVING, "exec"),
                namespace,
            )
            final = namespace["ann"].threads.get_state(namespace["thread"]["thread_id"])["values"]
            assert (final["phase"], final["stop_reason"]) == ("COMPLETED", "completed")
        finally:
            process.terminate()
            output, _ = process.communicate(timeout=PATIENCE_S)
        assert f"API    {first}" in output and f"API    {second}" in output, output
        assert not reachable_aegra(first) and not reachable_aegra(second)


def reachable_aegra(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2, verify=tls.context()).status_code == 200
    except httpx.TransportError:
        return False
