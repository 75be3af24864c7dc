"""The served edge under a flood: does a customer's run and an approver's decision keep their
latency, and the server its memory, while anonymous clients send 16 MB tokens and 300 MB bodies?

    python -m benchmarks.edge_load [--engine langgraph|aegra|both] [--rounds 20] [--attackers 8]

On a fresh database and the reference services, one server of each engine as `loopwright serve`
starts it, the same work twice, in this process:

1. **idle**: `rounds` refunds, each a customer's run on a new thread (it waits for an approval)
   and an approver's decision (it completes);
2. **attacked**: the same while `attackers` threads send, without a token and in turn, a request
   whose bearer token is 16 MB (to `/live`) and one whose body is 300 MB (to a thread's runs).

Printed per engine: p50 and p95 of each phase's run and decision latency and their ratio
(attacked / idle: the goal is at most 2.0), the attackers' answers (431 for a head past the
edge's bound, 401 for a body without a token, `closed` for a connection the server cut), and
the server process's peak resident memory in each phase (the goal: at most `MEMORY_BOUND_MB`
more under attack). The machine's load is printed alongside.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.perf_setup import Bench, bench_environment
from loopwright.core import tls
from loopwright.server import cluster
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.launch import GRAPH_ID, server_env, start_server
from loopwright_refunds.services.admin import create_order

TOKEN_BYTES = 16 * 1024 * 1024
BODY_BYTES = 300 * 1024 * 1024
CHUNK = 1024 * 1024
LATENCY_GOAL = 2.0  # p95 attacked / p95 idle
MEMORY_BOUND_MB = 128  # peak resident memory under attack, above the idle phase's peak
TOKENS = {
    "edge-u1": {"user_id": "u-1", "roles": ["customer"]},
    "edge-a1": {"user_id": "a-1", "roles": ["approver"]},
}
TASK = "Check whether order {order} can be refunded and refund it if so."


def resident_mb(pid: int) -> float:
    """The process's resident memory now, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Peak:
    """The highest resident memory of a process, sampled every 50 ms while it is watched."""

    pid: int
    mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextlib.contextmanager
    def watching(self) -> Iterator[Peak]:
        self.mb, self._stop = resident_mb(self.pid), threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.05):
                with contextlib.suppress(OSError):
                    self.mb = max(self.mb, resident_mb(self.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield self
        finally:
            self._stop.set()
            sampler.join()


def _status(sock: socket.socket) -> str:
    """The status the server answered with, or `closed`."""
    try:
        answer = sock.recv(4096)
    except OSError:
        return "closed"
    return answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"


def huge_token(host: str, port: int) -> str:
    """A request whose bearer token is `TOKEN_BYTES` long, to a probe."""
    head = b"GET /live HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    with socket.create_connection((host, port), timeout=30) as sock:
        try:
            sock.sendall(head)
            for _ in range(TOKEN_BYTES // CHUNK):
                sock.sendall(b"a" * CHUNK)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass  # the server cut it off: its answer, if any, is waiting
        return _status(sock)


def huge_body(host: str, port: int) -> str:
    """A run request without a token whose body is `BODY_BYTES` long."""
    head = (
        f"POST /threads/{uuid.uuid4()}/runs HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        try:
            sock.sendall(head)
            for _ in range(BODY_BYTES // CHUNK):
                sock.sendall(b" " * CHUNK)
        except OSError:
            pass
        return _status(sock)


@dataclass
class Attackers:
    """`count` threads sending huge tokens and huge bodies in turn, until stopped."""

    url: str
    count: int
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def attacking(self) -> Iterator[Attackers]:
        address = httpx.URL(self.url)
        host, port = str(address.host), int(address.port or 80)

        def attack(index: int) -> None:
            kinds = (huge_token, huge_body)
            turn = index
            while not self._stop.is_set():
                try:
                    answer = kinds[turn % 2](host, port)
                except OSError as exc:
                    answer = f"error {type(exc).__name__}"
                with self._lock:
                    self.answers[f"{kinds[turn % 2].__name__} {answer}"] += 1
                turn += 1

        threads = [
            threading.Thread(target=attack, args=(i,), daemon=True) for i in range(self.count)
        ]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(60)


@dataclass
class Round:
    run_s: float
    decision_s: float
    completed: bool


def refund_round(http: httpx.Client, bench: Bench, order: str) -> Round:
    """A customer's run that waits for an approval, then an approver's decision."""
    create_order(bench.endpoints, order, "u-1", "80.00")
    customer = {"Authorization": "Bearer edge-u1"}
    started = time.monotonic()
    thread_id = (
        http.post("/threads", json={}, headers=customer).raise_for_status().json()["thread_id"]
    )
    http.post(
        f"/threads/{thread_id}/runs/wait",
        json={"assistant_id": GRAPH_ID, "input": {"task": TASK.format(order=order)}},
        headers=customer,
    ).raise_for_status()
    [interrupt] = http.get(f"/threads/{thread_id}/state", headers=customer).json()["interrupts"]
    run_s = time.monotonic() - started
    value = interrupt["value"]
    decision = {
        "approval_id": value["approval_id"],
        "digest": value["digest"],
        "decision": "approve",
    }
    started = time.monotonic()
    final = http.post(
        f"/threads/{thread_id}/runs/wait",
        json={"assistant_id": GRAPH_ID, "command": {"resume": {interrupt["id"]: decision}}},
        headers={"Authorization": "Bearer edge-a1"},
    ).raise_for_status()
    return Round(run_s, time.monotonic() - started, final.json().get("stop_reason") == "completed")


@dataclass
class Phase:
    rounds: list[Round]
    peak_mb: float

    def p(self, which: str, quantile: float) -> float:
        values = sorted(getattr(r, which) for r in self.rounds)
        return values[min(len(values) - 1, round(quantile * (len(values) - 1)))]


def phase(url: str, pid: int, bench: Bench, rounds: int, prefix: str) -> Phase:
    with (
        httpx.Client(base_url=url, timeout=300, verify=tls.context()) as http,
        Peak(pid).watching() as peak,
    ):
        done = [refund_round(http, bench, f"O-{prefix}{i}") for i in range(rounds)]
    return Phase(done, peak.mb)


@dataclass
class Measured:
    engine: str
    idle: Phase
    attacked: Phase
    answers: collections.Counter[str]


def measure(url: str, pid: int, bench: Bench, rounds: int, attackers: int, engine: str) -> Measured:
    phase(url, pid, bench, 2, "9")  # warm: the first runs load what every later one uses
    idle = phase(url, pid, bench, rounds, "1")
    with Attackers(url, attackers).attacking() as attack:
        time.sleep(1)  # the flood under way before the first round
        attacked = phase(url, pid, bench, rounds, "2")
    return Measured(engine, idle, attacked, attack.answers)


@contextlib.contextmanager
def served(engine: str, bench: Bench, redis_url: str) -> Iterator[tuple[str, int]]:
    """A server of `engine` on the bench's database, as `loopwright serve` starts it: its URL
    and its process id."""
    extra = {**bench.endpoints.to_env(), "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS))}
    with tempfile.TemporaryDirectory(prefix=f"lw-edge-load-{engine}-") as tmp:
        workdir = Path(tmp)
        if engine == "langgraph":
            env = server_env(
                {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                {"DATABASE_URL": bench.database_url, **extra},
            )
            with start_server(workdir, env, port=_port()) as server:
                yield server.url, server.process.pid
            return
        env = cluster.instance_env(
            os.environ,
            database_url=bench.database_url,
            redis_url=redis_url,
            config=cluster.write_config(workdir),
            extra=extra,
        )
        try:
            with cluster.start_instance(
                workdir, env, index=1, host="127.0.0.1", port=_port()
            ) as instance:
                yield instance.url, instance.process.pid
        finally:
            cluster.forget_keys(redis_url, cluster.deployment_prefix(bench.database_url))


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def report(measured: Measured) -> str:
    idle, attacked = measured.idle, measured.attacked
    lines = [f"{measured.engine}:"]
    for which, label in (("run_s", "customer's run"), ("decision_s", "approver's decision")):
        p95 = attacked.p(which, 0.95) / idle.p(which, 0.95)
        lines.append(
            f"  {label:20} idle p50 {idle.p(which, 0.5):6.3f} s p95 {idle.p(which, 0.95):6.3f} s"
            f" | attacked p50 {attacked.p(which, 0.5):6.3f} s p95 {attacked.p(which, 0.95):6.3f} s"
            f" | p95 ratio {p95:4.2f} (goal <= {LATENCY_GOAL})"
        )
    grew = attacked.peak_mb - idle.peak_mb
    lines.append(
        f"  peak memory: idle {idle.peak_mb:.0f} MB, attacked {attacked.peak_mb:.0f} MB"
        f" (+{grew:.0f} MB, bound {MEMORY_BOUND_MB} MB)"
    )
    completed = sum(r.completed for r in (*idle.rounds, *attacked.rounds))
    lines.append(f"  rounds completed: {completed}/{len(idle.rounds) + len(attacked.rounds)}")
    lines.append(f"  the attackers were answered: {dict(sorted(measured.answers.items()))}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.edge_load")
    parser.add_argument("--engine", choices=["langgraph", "aegra", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--db", default=None, help="a Postgres server URL (default: embedded)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)
    engines = ["langgraph", "aegra"] if args.engine == "both" else [args.engine]
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for engine in engines:
        with bench_environment(args.db) as bench, served(engine, bench, args.redis) as (url, pid):
            measured = measure(url, pid, bench, args.rounds, args.attackers, engine)
        print(report(measured), flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
