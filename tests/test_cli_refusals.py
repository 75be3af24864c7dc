"""What the command line refuses in one line (exit 2), before anything starts or is written.

The servers' own identity named as a person; two tokens given to `tokens hash`; the published
development tokens (or any plain ones) on an address others reach, however they come; and settings a server would take and could not
use (a model spec, the agent's own service settings) on either engine, whether started by
`loopwright serve` or as the engine's process itself; a database named with --db that is not
there, which a reading command would otherwise have read as an empty one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.cluster import redis_unreachable
from loopwright.server.service_identity import SERVICE_USER_ID
from tests.ports import reserved_port, reserved_ports
from tests.runtime_fixtures import DEMO_TASK, PATIENCE_S, REPO, cli

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"  # never reached: refused before
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
NO_IDENTITIES = {"LOOPWRIGHT_TOKENS": "", "LOOPWRIGHT_TOKENS_FILE": "", "LOOPWRIGHT_JWKS": ""}
# Identities of the operator's (a hashed table): no note about the development ones.
IDENTITIES = {
    **NO_IDENTITIES,
    "LOOPWRIGHT_TOKENS": json.dumps(
        hashed_table({"t-u1-" + "x" * 16: {"user_id": "u-1", "roles": ["customer"]}})
    ),
}
AEGRA = pytest.mark.skipif(
    importlib.util.find_spec("aegra_api") is None or redis_unreachable(REDIS_URL) is not None,
    reason="needs aegra-api and Redis",
)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal is, on stderr, with exit code 2."""
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    "args",
    [
        ("run", DEMO_TASK, "--user", SERVICE_USER_ID),
        ("approvals", "approve", "apr_1", "--as", SERVICE_USER_ID),
        ("approvals", "reject", "apr_1", "--as", SERVICE_USER_ID, "--comment", "no"),
        ("tokens", "new", "--user", SERVICE_USER_ID, "--role", "customer"),
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_the_servers_own_user_id_is_no_persons(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / "home"
    refused = cli(*args, env={"LOOPWRIGHT_HOME": str(home), "DATABASE_URL": ""})
    assert f"{SERVICE_USER_ID}: that is the servers' own identity" in one_line(refused)
    assert not home.exists() and "lw_" not in refused.stdout  # no database, no token


@pytest.mark.parametrize(
    "args",
    [
        ("runs",),
        ("show", "run-1"),
        ("approvals", "list"),
        ("approvals", "approve", "apr_1", "--as", "a-1"),
        ("retention", "--older-than", "1"),
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_database_named_that_is_not_there_is_a_mistake_not_an_empty_one(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    """A mistyped --db path is said to be no database (and none is made there); with no --db,
    a home where no run has been yet holds no runs."""
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home"), "DATABASE_URL": ""}
    typo = tmp_path / "loopwrigth.db"
    refused = one_line(cli(*args, "--db", f"sqlite:///{typo}", env=env))
    assert refused.endswith(f"no loopwright database at sqlite:///{typo}"), refused
    assert not typo.exists()
    if args == ("runs",):
        assert cli("runs", "--json", env=env, expect=0).stdout.count('"run_id"') == 0


def test_tokens_hash_takes_one_token_and_refuses_two() -> None:
    """Two lines on standard input are refused, not hashed in part (the first, as they were)."""
    token = "lw_" + "a" * 40
    assert cli("tokens", "hash", token, env={}, expect=0).stdout.startswith("sha256:")
    two = subprocess.run(
        [sys.executable, "-m", "loopwright", "tokens", "hash"],
        input=f"{token}\nlw_{'b' * 40}\n",
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert "one token at a time: 2 lines were given" in one_line(two)
    assert two.stdout == ""


def test_serve_never_falls_back_to_the_published_tokens_off_loopback(tmp_path: Path) -> None:
    """Where no identities are configured `langgraph dev` serves the development table, whose
    tokens are in the repository: on a loopback host only. Elsewhere: one line saying how to
    configure identities."""
    home, host = tmp_path / "home", "0.0.0.0"
    with reserved_port(host) as port:
        refused = cli(
            *("serve", "--host", host, "--port", str(port), "--db", NOWHERE),
            env={"LOOPWRIGHT_HOME": str(home), **NO_IDENTITIES},
        )
    line = one_line(refused)
    assert (
        f"development tokens are published: they serve a loopback --host only, not {host}" in line
    )
    assert "LOOPWRIGHT_JWKS" in line and "LOOPWRIGHT_TOKENS_FILE" in line
    assert not home.exists()


DEV_TABLE = json.loads((REPO / "loopwright/server/dev-tokens.json").read_text())
PUBLISHED_WAYS = {
    # The flag, with no identities or with the operator's own.
    "--dev-tokens": (["--dev-tokens"], NO_IDENTITIES, "--dev-tokens: the development tokens"),
    "--dev-tokens beside a table": (["--dev-tokens"], IDENTITIES, "--dev-tokens:"),
    # Plain tokens allowed, in a table of the operator's own.
    "plain tokens": (
        [],
        {
            **NO_IDENTITIES,
            "LOOPWRIGHT_DEV_TOKENS": "1",
            "LOOPWRIGHT_TOKENS": json.dumps({"t-u1-" + "x" * 16: {"user_id": "u-1"}}),
        },
        "LOOPWRIGHT_DEV_TOKENS=1 takes plain tokens",
    ),
    # The published tokens, stored hashed as production tables are.
    "a table with a published token": (
        [],
        {**NO_IDENTITIES, "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(DEV_TABLE))},
        "the token table takes the published development token dev-",
    ),
}


@pytest.mark.parametrize("engine", ["langgraph", "aegra"])
@pytest.mark.parametrize("way", list(PUBLISHED_WAYS))
def test_serve_refuses_the_published_tokens_off_loopback_however_they_come(
    way: str, engine: str, tmp_path: Path
) -> None:
    """Whichever way the development tokens (or plain ones) would be taken, a server listening
    where others reach it refuses to start, in one line saying how to configure identities."""
    flags, env, said = PUBLISHED_WAYS[way]
    home, host = tmp_path / "home", "0.0.0.0"
    with reserved_port(host) as port:
        refused = cli(
            *("serve", "--engine", engine, "--host", host, "--port", str(port), *flags),
            *("--db", NOWHERE, "--instances", "1"),
            env={"LOOPWRIGHT_HOME": str(home), **env},
        )
    line = one_line(refused)
    assert said in line and f"loopback --host only, not {host}" in line, line
    assert "LOOPWRIGHT_JWKS" in line and "LOOPWRIGHT_TOKENS_FILE" in line, line
    assert not home.exists()


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("LOOPWRIGHT_MODEL", "nonsense:x", "LOOPWRIGHT_MODEL='nonsense:x': unknown model spec"),
        ("LOOPWRIGHT_SERVICES", "{x", "what its servers share could not be started:"),
    ],
)
@pytest.mark.parametrize("engine", ["langgraph", pytest.param("aegra", marks=AEGRA)])
def test_serve_refuses_a_setting_no_server_could_use_on_either_engine(
    engine: str, name: str, value: str, said: str, tmp_path: Path
) -> None:
    """Not a server that starts and fails every run, nor a traceback: one line, nothing left
    running (the agent's shared services are not started, nor any instance)."""
    home = tmp_path / "home"
    with reserved_ports(2) as port:
        refused = cli(
            *("serve", "--engine", engine, "--port", str(port), "--db", NOWHERE),
            *(("--redis", REDIS_URL) if engine == "aegra" else ()),
            env={"LOOPWRIGHT_HOME": str(home), **IDENTITIES, name: value},
        )
    line = one_line(refused)
    assert said in line and value in line, line
    assert not (home / "services").exists() and not (home / "server").exists()


@pytest.mark.parametrize(
    "engine",
    [
        "loopwright.server.dev",
        pytest.param(
            "loopwright.server.aegra",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("aegra_api") is None, reason="needs aegra-api"
            ),
        ),
    ],
)
def test_an_engine_process_refuses_a_model_it_could_not_use_as_it_starts(
    engine: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        **NO_IDENTITIES,
        "LOOPWRIGHT_TOKENS_FILE": str(REPO / "loopwright/server/dev-tokens.json"),
        "LOOPWRIGHT_DEV_TOKENS": "1",
        "LOOPWRIGHT_MODEL": "nonsense:x",
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
    }
    with reserved_port() as port:
        started = subprocess.run(
            [sys.executable, "-m", engine, "--port", str(port)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=PATIENCE_S,
            stdin=subprocess.DEVNULL,
        )
    assert started.returncode == 1, started.stdout + started.stderr
    assert started.stderr == (
        "LOOPWRIGHT_MODEL='nonsense:x': unknown model spec 'nonsense:x'; expected one of:"
        " openai:<model>\n"
    )
