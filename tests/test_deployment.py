"""The deployable unit: the Dockerfile and compose.yaml docs/serving.md starts with one command.

No container runtime runs here, so the suite checks the compose file's structure itself (every
service the page names, each instance's command as `loopwright serve --engine aegra` parses
it, its environment pointing at the services compose starts, healthchecks on the readiness
route, start order), and then runs the same processes directly: the business services and two
instances, with the commands and environment compose gives them, against the local Postgres
and Redis, and sees a refund run through them (started on one instance, approved on the other).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import typer
import yaml

from loopwright import tls
from loopwright.cli import app
from loopwright.processes import START_TIMEOUT_S
from loopwright.server import cluster as cluster_module
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ENV_VAR as SERVICES_ENV
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests import docs_pages, test_aegra_scaleout
from tests.ports import reserved_port
from tests.runtime_fixtures import PATIENCE_S, REPO, sdk_client
from tests.test_aegra_scaleout import REDIS_URL
from tests.test_server_langgraph import GRAPH, decision_for, values_of

COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
INSTANCE = re.compile(r"loopwright-(\d+)")
READY = "/ready"  # Aegra's readiness route, unauthenticated
PAGE, DEPLOYING = "docs/serving.md", "Deploying: one command"


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def instances(services: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in services.items() if INSTANCE.fullmatch(name)}


def serve_options(command: list[str]) -> dict[str, Any]:
    """The options `loopwright serve` takes `command` for, parsed by the CLI itself."""
    assert command[:2] == ["loopwright", "serve"], command
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    params: dict[str, Any] = serve.make_context("serve", list(command[2:])).params
    return params


def options(command: list[str]) -> dict[str, str]:
    """`--name value` pairs of a command line."""
    found = {}
    for i, word in enumerate(command):
        if word.startswith("--") and i + 1 < len(command) and not command[i + 1].startswith("--"):
            found[word] = command[i + 1]
    return found


def healthcheck_url(spec: Mapping[str, Any]) -> str:
    [url] = re.findall(r"http://[^'\"]+", " ".join(spec["healthcheck"]["test"]))
    return url


def documented_commands() -> list[str]:
    """The command lines of docs/serving.md's "Deploying" section."""
    return [
        line for block in docs_pages.blocks(PAGE, "sh", DEPLOYING) for line in block.splitlines()
    ]


def test_the_compose_file_starts_what_the_page_says() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "business"} <= set(services)
    serving = instances(services)
    assert len(serving) >= 2, "a deployment of several instances"
    commands = [c.split("#")[0].strip() for c in documented_commands()]
    assert "docker compose up --build" in commands
    page = docs_pages.section(PAGE, DEPLOYING)
    postgres = services["postgres"]["environment"]
    business = options(services["business"]["command"])
    assert services["business"]["command"][:3] == ["python", "-m", "loopwright_refunds.services"]
    assert business["--host"] == "0.0.0.0"
    business_ports = {
        "orders": business["--orders-port"],
        "policies": business["--policies-port"],
        "payments": business["--payments-port"],
    }
    assert healthcheck_url(services["business"]).startswith(
        f"http://127.0.0.1:{business_ports['payments']}/"
    )
    for name, spec in sorted(serving.items()):
        served = serve_options(spec["command"])
        assert (served["engine"], served["instances"], served["host"]) == ("aegra", 1, "0.0.0.0")
        port = served["port"]
        assert healthcheck_url(spec) == f"http://127.0.0.1:{port}{READY}"
        [published] = spec["ports"]
        host_port, container_port = published.split(":")
        assert int(container_port) == port and f"http://127.0.0.1:{host_port}" in page, name
        env = spec["environment"]
        database = urlsplit(env["DATABASE_URL"])
        assert (database.hostname, database.username, database.password) == (
            "postgres",
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
        )
        assert database.path == f"/{postgres['POSTGRES_DB']}"
        assert urlsplit(env[cluster_module.REDIS_ENV]).hostname == "redis"
        endpoints = ServiceEndpoints.model_validate_json(env[SERVICES_ENV])
        for service, port_of in business_ports.items():
            url = urlsplit(getattr(endpoints, service))
            assert (url.hostname, str(url.port)) == ("business", port_of), service
        assert spec["build"] == "." and spec["stop_grace_period"]
    # The first instance waits for what it needs, the others for the first (its migrations).
    first, *others = sorted(serving, key=lambda name: int(INSTANCE.fullmatch(name)[1]))  # type: ignore[index]
    assert serving[first]["depends_on"] == {
        **{name: {"condition": "service_healthy"} for name in ("postgres", "redis", "business")},
        "identities": {"condition": "service_completed_successfully"},
    }
    for name in others:
        assert serving[name]["depends_on"] == {first: {"condition": "service_healthy"}}
    for name in ("postgres", "redis", "business"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"


def mounts(spec: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """A service's volumes: the volume's name -> (where it is mounted, its mode)."""
    found = {}
    for volume in spec.get("volumes", []):
        name, where, *mode = volume.split(":")
        found[name] = (where, mode[0] if mode else "rw")
    return found


def identities_script() -> tuple[str, str]:
    """The identities service's program, and the folder of the volume it writes the table to."""
    spec = compose()["services"]["identities"]
    [(folder, mode)] = [m for name, m in mounts(spec).items() if name == "identities"]
    assert mode == "rw" and spec["command"][:2] == ["python", "-c"]
    return spec["command"][2], folder


def test_the_instances_serve_the_deployments_own_identities_never_the_published_ones() -> None:
    """They listen on every address of their containers: no --dev-tokens anywhere, and each
    instance reads the table the identities service writes, from a volume it cannot write."""
    assert "--dev-tokens" not in COMPOSE.read_text() + DOCKERFILE.read_text()
    script, folder = identities_script()
    assert f'"{folder}/tokens.json"' in script and "loopwright" in script
    for name, spec in instances(compose()["services"]).items():
        assert not serve_options(spec["command"])["dev_tokens"], name
        assert mounts(spec)["identities"] == (folder, "ro"), name
        assert spec["environment"]["LOOPWRIGHT_TOKENS_FILE"] == f"{folder}/tokens.json", name


def test_the_image_runs_as_a_user_and_checks_readiness() -> None:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    [health] = [i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK")]
    assert f"http://127.0.0.1:2031{READY}" in " ".join(lines[health : health + 2])
    [cmd] = [  # the image's own: not HEALTHCHECK's, continued from the line before
        line
        for before, line in itertools.pairwise(lines)
        if line.startswith("CMD ") and not before.endswith("\\")
    ]
    command = json.loads(cmd.removeprefix("CMD "))
    served = serve_options(command)
    assert (served["engine"], served["port"]) == ("aegra", 2031) and "EXPOSE 2031" in lines
    # The instances compose starts are the image's command.
    for spec in instances(compose()["services"]).values():
        assert spec["command"] == command


@contextmanager
def started(
    command: list[str], env: Mapping[str, str], cwd: Path, ready_url: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`command` as a process of its own (as its container would run it), until `ready_url`
    answers 200; stopped with SIGTERM, as compose stops a container."""
    cwd.mkdir(parents=True, exist_ok=True)
    with (cwd / "output.log").open("ab") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S  # a start, however loaded the machine
        while True:
            assert process.poll() is None, (cwd / "output.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{shlex.join(command)} never got ready"
            try:
                if httpx.get(ready_url, timeout=2, verify=tls.context()).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def local(url: str, ports: Mapping[str, int], host: str) -> str:
    """A URL compose gives, pointed at the local process standing for `host`'s container."""
    parts = urlsplit(url)
    if parts.hostname != host:
        return url
    return parts._replace(netloc=f"127.0.0.1:{ports[str(parts.port)]}").geturl()


def with_option(command: list[str], flag: str, value: str) -> list[str]:
    """`command` with `flag`'s value replaced."""
    changed = list(command)
    changed[changed.index(flag) + 1] = value
    return changed


@pytest.mark.postgres
def test_the_processes_compose_starts_serve_a_run(postgres_server_url: str, tmp_path: Path) -> None:
    pytest.importorskip("aegra_api")
    if not test_aegra_scaleout.redis_reachable():
        pytest.skip(f"no Redis at {REDIS_URL}")
    services = compose()["services"]
    with ExitStack() as stack:
        # The container ports, each a free local port held until its process listens on it.
        business = list(services["business"]["command"])
        business_ports: dict[str, int] = {}
        for flag in ("--orders-port", "--policies-port", "--payments-port"):
            business_ports[options(business)[flag]] = port = stack.enter_context(reserved_port())
            business = with_option(business, flag, str(port))
        business = with_option(business, "--host", "127.0.0.1")
        business = with_option(business, "--data-dir", str(tmp_path / "business"))
        url = stack.enter_context(fresh_database(postgres_server_url, prefix="lw_test"))
        stack.callback(cluster_module.forget_keys, REDIS_URL, cluster_module.deployment_prefix(url))
        health = local(healthcheck_url(services["business"]), business_ports, "127.0.0.1")
        python = [sys.executable, *business[1:]]  # `python` in the image
        stack.enter_context(started(python, base_env(), tmp_path / "business-proc", health))
        given = json.loads(next(iter(instances(services).values()))["environment"][SERVICES_ENV])
        endpoints = {k: local(v, business_ports, "business") for k, v in given.items()}
        tokens, folder = make_identities(tmp_path / "identities")
        running = []
        for name, spec in sorted(instances(services).items()):
            port = stack.enter_context(reserved_port())
            command = with_option(spec["command"], "--host", "127.0.0.1")
            command = with_option(command, "--port", str(port))
            command[0] = str(Path(sys.executable).parent / "loopwright")  # `loopwright` there
            env = {
                **spec["environment"],
                "DATABASE_URL": url,  # compose's database, on the local server
                cluster_module.REDIS_ENV: REDIS_URL,
                SERVICES_ENV: json.dumps(endpoints),
                # The identities volume, as the identities service left it.
                "LOOPWRIGHT_TOKENS_FILE": spec["environment"]["LOOPWRIGHT_TOKENS_FILE"].replace(
                    folder, str(tmp_path / "identities")
                ),
            }
            home = tmp_path / name  # a container's own filesystem
            ready = healthcheck_url(spec).replace(
                f":{serve_options(spec['command'])['port']}/", f":{port}/"
            )
            env |= {"LOOPWRIGHT_HOME": str(home)}
            stack.enter_context(started(command, {**base_env(), **env}, home, ready))
            running.append(f"http://127.0.0.1:{port}")

        customer = sdk_client(url=running[-1], headers={"Authorization": f"Bearer {tokens['u-1']}"})
        approver = sdk_client(url=running[0], headers={"Authorization": f"Bearer {tokens['a-1']}"})
        for published in ("dev-u1", "dev-a1"):  # the development tokens are nobody's here
            with pytest.raises(httpx.HTTPStatusError) as refused:
                sdk_client(
                    url=running[0], headers={"Authorization": f"Bearer {published}"}
                ).threads.create()
            assert refused.value.response.status_code == 401
        thread_id = customer.threads.create()["thread_id"]
        task = "Check whether order O-42 can be refunded and refund it if so."
        customer.runs.wait(thread_id, GRAPH, input={"task": task})
        [interrupt] = approver.threads.get_state(thread_id)["interrupts"]
        decision = decision_for(dict(interrupt), "approve", "a-1")
        approver.runs.wait(thread_id, GRAPH, command={"resume": decision})
        state = values_of(customer, thread_id)
        assert state["stop_reason"] == "completed" and state["verification"]["verified"]
        refunds = list_refunds(ServiceEndpoints.model_validate(endpoints), "O-42")
        assert len(refunds) == 1


def make_identities(volume: Path) -> tuple[dict[str, str], str]:
    """The identities service's program, run as its container would, on `volume` for its
    volume: the tokens it printed by user, and the folder it stands for. Run again, as on a
    later start, it keeps the table and prints no token."""
    script, folder = identities_script()
    volume.mkdir()
    env = {**base_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def run() -> list[str]:
        ran = subprocess.run(
            [sys.executable, "-c", script.replace(folder, str(volume))],
            env=env,
            cwd=volume.parent,
            capture_output=True,
            text=True,
            timeout=PATIENCE_S,
        )
        assert ran.returncode == 0, ran.stderr
        return ran.stdout.splitlines()

    *printed, summary = run()
    said = [re.fullmatch(r"(\S+) \(\w+\): (\S+)", line) for line in printed]  # user (role): token
    tokens = {found[1]: found[2] for found in said if found}
    assert len(tokens) == len(printed), printed
    assert summary.endswith(f"{len(tokens)} users") and {"u-1", "a-1"} <= set(tokens)
    table = (volume / "tokens.json").read_text()
    assert not any(token in table for token in tokens.values())  # hashed, every one
    assert run() == [summary] and (volume / "tokens.json").read_text() == table
    return tokens, folder


def base_env() -> dict[str, str]:
    """What a container's environment has besides compose's: a path, none of this test
    process's own settings (the Postgres URL pytest was given, say)."""
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "TMPDIR")
    return {k: v for k, v in os.environ.items() if k in keep}
