"""What a run costs served by the multi-instance engine (Aegra), next to `loopwright worker`.

    python -m benchmarks.served_cost [--runs 40] [--rounds 3] [--db SERVER_URL] [--redis URL]

On one fresh database and the reference services, in this process, `--rounds` rounds of the
same work, each on orders of its own (an instance's CPU for a batch of runs varies by half from
one minute to the next on a small machine: each figure printed is the median of the rounds',
loopwright's share is the median of the rounds' shares, and each round's share is printed too):

1. **worker**: N runs of an eligible small refund (20.00: no approval), each on its own order,
   submitted as `Runner.submit` submits them (what that costs the client is printed) and
   held; one `loopwright worker` started and polling; the runs released at once; the worker's
   CPU (user + system, /proc) from the release until every run is COMPLETED, per run. A worker
   advances one run at a time;
2. **engine**: one Aegra instance as `loopwright serve --engine aegra` starts one
   (`server.cluster`); N more such runs created through its API (a thread, then a run, each)
   by a client sending them all at once, the client's wall time for that; the instance's CPU
   from before the first request until every run is COMPLETED, per run (its API work
   included: that is what serving costs);
3. **floors**: what a plain Aegra instance (no auth, no loopwright) spends on as many runs of a
   graph that does nothing (`benchmarks.engine_floor`): one node, and a chain of as many
   supersteps as the worker's runs took (their checkpoints counted). The engine's cost less the
   second floor is loopwright's own share of a served run, set against the worker's whole run;
4. **one at a time**: the engine and the chain's floor again, Aegra running one run at a time
   (`ONE_AT_A_TIME`) as the worker does, where by default it runs up to 30 at once: a served
   run's graph runs in a thread of its own (`server.graph`), and with the scripted model's
   zero latency 30 runs' threads take turns at the interpreter, which one run at a time does
   not (the floor's runs are coroutines on the event loop); loopwright's share again;
5. where the share at Aegra's default misses its goal, another engine pass of as many runs with the instance
   under cProfile (`benchmarks.profiled`): the functions with the most own time.

Every order must end with exactly one refund. The machine's load is printed alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from langgraph_sdk.client import LangGraphClient

from benchmarks import engine_floor as engine_floor_graph
from benchmarks.perf_setup import Bench, bench_environment
from benchmarks.step_time import top_functions
from benchmarks.throughput import (
    READY,
    REPO,
    TASK,
    _completed,
    _hold,
    _start_worker,
    submitted,
)
from benchmarks.worker_time import process_cpu_s
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.core import tls
from loopwright.server import cluster
from loopwright.server.admissions import PER_PRINCIPAL_ENV
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.launch import GRAPH_ID
from loopwright_refunds.services.admin import create_order, list_refunds

AMOUNT = "20.00"
RUNS = 40
ROUNDS = 3
CPU_GOAL = (
    1.3  # the engine's CPU per run, less its floor of as many supersteps, against the worker's
)
SUBMIT_GOAL_S = 1.0  # client time to create RUNS runs through the API
TOKEN = "bench-u1"
TOKENS = json.dumps(hashed_table({TOKEN: {"user_id": "u-1", "roles": ["customer"]}}))
AUTHORIZATION = {"Authorization": f"Bearer {TOKEN}"}
FLOOR_GRAPH = "floor"
CHAIN_GRAPH = "chain"
# Aegra's settings for one run at a time, as one `loopwright worker` advances its runs (Aegra's
# default is up to 30 at once: 3 queue loops of 10 jobs each).
ONE_AT_A_TIME = {"WORKER_COUNT": "1", "N_JOBS_PER_WORKER": "1"}


def _wait_completed(url: str, run_ids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while _completed(url, run_ids) < len(run_ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{_completed(url, run_ids)}/{len(run_ids)} runs completed")
        time.sleep(0.05)


def checkpoints_per_run(database_url: str, run_ids: list[str]) -> int:
    """The median number of checkpoints the runs wrote: their supersteps, the input's
    included."""
    with open_checkpointer(database_url) as saver:
        counts = sorted(
            len(list(saver.list({"configurable": {"thread_id": run_id}}))) for run_id in run_ids
        )
    return counts[len(counts) // 2]


@dataclass(frozen=True)
class WorkerCost:
    cpu_s: float  # one worker's CPU seconds per run
    checkpoints: int  # a run's checkpoints (the median)
    # The submitting process's CPU seconds per run: what the instance's API does for a run
    # it creates, on the worker's path a client's (`throughput.submitted`).
    submit_cpu_s: float


def worker_cpu_per_run(bench: Bench, orders: list[str]) -> WorkerCost:
    """CPU seconds of one `loopwright worker` per run, from the release to the last end, and
    how many checkpoints a run wrote; and what submitting the runs cost."""
    run_ids, submit_cpu_s = submitted(bench, orders)
    _hold(bench.database_url, run_ids, held=True)
    with tempfile.TemporaryDirectory(prefix="lw-served-cost-") as tmp:
        log = Path(tmp) / "worker.log"
        process = _start_worker(bench, 0, Path(tmp), log)
        try:
            deadline = time.monotonic() + 60
            while READY not in log.read_text():
                if time.monotonic() > deadline:
                    raise TimeoutError("the worker did not start")
                time.sleep(0.05)
            before = process_cpu_s(process.pid)
            _hold(bench.database_url, run_ids, held=False)
            _wait_completed(bench.database_url, run_ids)
            used = process_cpu_s(process.pid) - before
        finally:
            process.terminate()
            process.wait(timeout=30)
    return WorkerCost(
        used / len(run_ids), checkpoints_per_run(bench.database_url, run_ids), submit_cpu_s
    )


async def _create_runs(
    url: str, graph_id: str, tasks: list[str], headers: dict[str, str]
) -> list[tuple[str, str]]:
    """Every run at once: a thread each, then its run; (thread id, run id) of each."""
    transport = httpx.AsyncHTTPTransport(retries=5, verify=tls.context())
    client = LangGraphClient(httpx.AsyncClient(base_url=url, headers=headers, transport=transport))

    async def one(task: str) -> tuple[str, str]:
        thread = await client.threads.create()
        run = await client.runs.create(thread["thread_id"], graph_id, input={"task": task})
        return str(thread["thread_id"]), str(run["run_id"])

    return list(await asyncio.gather(*(one(task) for task in tasks)))


@dataclass(frozen=True)
class EngineCost:
    cpu_s: float  # one Aegra instance's CPU seconds per run
    loop_cpu_s: float  # of which its main thread's: the event loop (API, queue, events, records)
    submitted_s: float  # client seconds to create the runs


def engine_cost(
    bench: Bench,
    orders: list[str],
    redis_url: str,
    profile: Path | None = None,
    *,
    one_at_a_time: bool = False,
) -> EngineCost:
    """What one Aegra instance spends on the runs, and the client on creating them; with
    `profile`, the instance runs under cProfile (`benchmarks.profiled`), which writes there as
    it stops (its CPU is the profiler's too: a profiled pass says where the time goes, not how
    much); `one_at_a_time`, the instance runs one run at a time (`ONE_AT_A_TIME`)."""
    with tempfile.TemporaryDirectory(prefix="lw-served-cost-aegra-") as tmp:
        workdir = Path(tmp)
        env = cluster.instance_env(
            os.environ,
            database_url=bench.database_url,
            redis_url=redis_url,
            config=cluster.write_config(workdir),
            # One customer creates every run at once: their bound is the batch.
            extra={
                **bench.endpoints.to_env(),
                "LOOPWRIGHT_TOKENS": TOKENS,
                PER_PRINCIPAL_ENV: str(len(orders)),
                **(ONE_AT_A_TIME if one_at_a_time else {}),
            },
        )
        program: tuple[str, ...] = ("loopwright.server.aegra",)
        if profile is not None:
            program = ("benchmarks.profiled", str(profile), *program)
            # The instance runs in its work directory: the benchmarks are found from here.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
            )
        with cluster.start_instance(
            workdir, env, index=1, host="127.0.0.1", port=_port(), program=program
        ) as one:
            tasks = [TASK.format(order_id=order_id) for order_id in orders]
            # A served run's id is its thread's.
            cost = _measured(
                one,
                lambda: asyncio.run(_create_runs(one.url, GRAPH_ID, tasks, AUTHORIZATION)),
                lambda runs: _wait_completed(bench.database_url, [t for t, _ in runs]),
            )
    cluster.forget_keys(redis_url, cluster.deployment_prefix(bench.database_url))
    return cost


def engine_floor(
    bench: Bench, runs: int, redis_url: str, *, nodes: int = 1, one_at_a_time: bool = False
) -> EngineCost:
    """What a plain Aegra instance spends on a run of `benchmarks.engine_floor`'s graphs: one
    node, or a chain of `nodes`; `one_at_a_time`, one run at a time."""
    graph_id, name = (FLOOR_GRAPH, "graph") if nodes == 1 else (CHAIN_GRAPH, "chain")
    with tempfile.TemporaryDirectory(prefix="lw-served-cost-floor-") as tmp:
        workdir = Path(tmp)
        config = workdir / "aegra.json"
        graph = Path(engine_floor_graph.__file__)
        config.write_text(json.dumps({"graphs": {graph_id: f"{graph}:{name}"}}))
        env = cluster.instance_env(
            os.environ,
            database_url=bench.database_url,
            redis_url=redis_url,
            config=config,
            extra={
                engine_floor_graph.NODES_ENV: str(nodes),
                **(ONE_AT_A_TIME if one_at_a_time else {}),
            },
        )
        plain = ("uvicorn", "aegra_api.main:app")
        with cluster.start_instance(
            workdir, env, index=1, host="127.0.0.1", port=_port(), program=plain
        ) as one:
            cost = _measured(
                one,
                lambda: asyncio.run(_create_runs(one.url, graph_id, ["-"] * runs, {})),
                lambda created: _wait_engine_runs(bench.database_url, [r for _, r in created]),
            )
    cluster.forget_keys(redis_url, cluster.deployment_prefix(bench.database_url))
    return cost


def _measured(
    instance: cluster.Instance,
    create: Callable[[], list[tuple[str, str]]],
    wait: Callable[[list[tuple[str, str]]], None],
) -> EngineCost:
    """The instance's CPU (all of it, and its event loop's) per run from before `create` until
    `wait` returns, and the client's time in `create`."""
    before = process_cpu_s(instance.pid)
    loop_before = process_cpu_s(instance.pid, main_thread=True)
    started = time.monotonic()
    runs = create()
    submitted_s = time.monotonic() - started
    wait(runs)
    used = process_cpu_s(instance.pid) - before
    loop = process_cpu_s(instance.pid, main_thread=True) - loop_before
    return EngineCost(used / len(runs), loop / len(runs), submitted_s)


def _wait_engine_runs(url: str, run_ids: list[str], timeout: float = 600) -> None:
    """Until Aegra's own records say every run succeeded."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            (done,) = conn.execute(
                "SELECT count(*) FROM runs WHERE status = 'success' AND run_id = ANY(%s)",
                (run_ids,),
            ).fetchone() or (0,)
            if done == len(run_ids):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{done}/{len(run_ids)} floor runs succeeded")
            time.sleep(0.05)


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Round:
    """One round's figures: the worker, the instance, and the instance's two floors, at Aegra's
    default concurrency; and the instance and the chain's floor one run at a time."""

    worker: WorkerCost
    engine: EngineCost
    floor: EngineCost
    chain: EngineCost
    serial_engine: EngineCost
    serial_chain: EngineCost

    @property
    def share(self) -> float:
        """loopwright's share of a served run: the instance's CPU less the chain's floor, as a
        fraction of the worker's whole run."""
        return (self.engine.cpu_s - self.chain.cpu_s) / self.worker.cpu_s

    @property
    def serial_share(self) -> float:
        """The same, the instance running one run at a time as the worker does."""
        return (self.serial_engine.cpu_s - self.serial_chain.cpu_s) / self.worker.cpu_s


def measure_round(bench: Bench, runs: int, redis_url: str, index: int) -> Round:
    """The worker's runs, the instance's, and both floors, on `runs` fresh orders each way."""
    base = 20_000 + 3 * index * runs
    worker_orders = [f"O-{base + i}" for i in range(runs)]
    engine_orders = [f"O-{base + runs + i}" for i in range(runs)]
    serial_orders = [f"O-{base + 2 * runs + i}" for i in range(runs)]
    for order_id in (*worker_orders, *engine_orders, *serial_orders):
        create_order(bench.endpoints, order_id, "u-1", AMOUNT)
    worker = worker_cpu_per_run(bench, worker_orders)
    engine = engine_cost(bench, engine_orders, redis_url)
    floor = engine_floor(bench, runs, redis_url)
    # As many supersteps as a worker's run: its checkpoints less the input's, a node each.
    nodes = worker.checkpoints - 2
    chain = engine_floor(bench, runs, redis_url, nodes=nodes)
    serial_engine = engine_cost(bench, serial_orders, redis_url, one_at_a_time=True)
    serial_chain = engine_floor(bench, runs, redis_url, nodes=nodes, one_at_a_time=True)
    for order_id in (*worker_orders, *engine_orders, *serial_orders):
        refunds = len(list_refunds(bench.endpoints, order_id))
        assert refunds == 1, f"{order_id}: {refunds} refunds"
    return Round(worker, engine, floor, chain, serial_engine, serial_chain)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--db", default=None, help="a Postgres server URL (default: embedded)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    if (why := cluster.redis_unreachable(args.redis)) is not None:
        raise SystemExit(f"served_cost: {why}")
    with bench_environment(args.db) as bench:
        load_before = os.getloadavg()[0]
        rounds = [measure_round(bench, args.runs, args.redis, i) for i in range(args.rounds)]
        load_after = os.getloadavg()[0]
        share = statistics.median(r.share for r in rounds)
        profiled = (
            where_the_time_goes(bench, args.runs, args.redis, args.rounds)
            if share > CPU_GOAL
            else None
        )
    _report(args.runs, rounds)
    print(f"  machine load (1 min): {load_before:.2f} before, {load_after:.2f} after")
    if profiled is not None:
        print("where the Aegra instance's time goes (another pass of as many runs, profiled):")
        print(profiled)


def where_the_time_goes(bench: Bench, runs: int, redis_url: str, after: int) -> str:
    """The functions with the most own time in an Aegra instance serving `runs` more runs (on
    orders after the `after` rounds')."""
    orders = [f"O-{20_000 + 3 * after * runs + i}" for i in range(runs)]
    for order_id in orders:
        create_order(bench.endpoints, order_id, "u-1", AMOUNT)
    with tempfile.TemporaryDirectory(prefix="lw-served-cost-profile-") as tmp:
        path = Path(tmp) / "instance.prof"
        engine_cost(bench, orders, redis_url, profile=path)
        return top_functions(str(path))


def _median_cost(costs: Sequence[EngineCost]) -> EngineCost:
    return EngineCost(
        statistics.median(c.cpu_s for c in costs),
        statistics.median(c.loop_cpu_s for c in costs),
        statistics.median(c.submitted_s for c in costs),
    )


def _report(runs: int, rounds: Sequence[Round]) -> None:
    worker = WorkerCost(
        statistics.median(r.worker.cpu_s for r in rounds),
        rounds[0].worker.checkpoints,
        statistics.median(r.worker.submit_cpu_s for r in rounds),
    )
    whole = statistics.median(
        (r.engine.cpu_s - r.chain.cpu_s) / (r.worker.cpu_s + r.worker.submit_cpu_s) for r in rounds
    )
    engine = _median_cost([r.engine for r in rounds])
    floor = _median_cost([r.floor for r in rounds])
    chain = _median_cost([r.chain for r in rounds])
    ratio = statistics.median(r.share for r in rounds)
    own = statistics.median(r.engine.cpu_s - r.chain.cpu_s for r in rounds)
    submitted_s = engine.submitted_s
    each = ", ".join(f"{r.share:.2f}x" for r in rounds)
    print(
        f"{runs} auto-approved refund runs each way, one refund per order; medians of {len(rounds)} rounds"
    )
    print(
        f"  loopwright worker   CPU {worker.cpu_s * 1000:6.1f} ms per run"
        f"  ({worker.checkpoints} checkpoints a run)"
    )
    print(
        f"  Aegra instance      CPU {engine.cpu_s * 1000:6.1f} ms per run  "
        f"({engine.cpu_s / worker.cpu_s:.2f}x the worker's)"
    )
    print(
        f"    its event loop    CPU {engine.loop_cpu_s * 1000:6.1f} ms per run  (Aegra's API, queue,"
        " stream events and run records; the rest is the runs' own threads)"
    )
    print(
        f"  Aegra's own floor   CPU {floor.cpu_s * 1000:6.1f} ms per run  (a one-node graph, no"
        f" auth: {floor.cpu_s / worker.cpu_s:.2f}x the worker's whole run; its {runs} runs"
        f" created in {floor.submitted_s:.2f} s)"
    )
    print(
        f"  Aegra's own floor   CPU {chain.cpu_s * 1000:6.1f} ms per run  (a chain of"
        f" {worker.checkpoints - 1} supersteps that do nothing, as many as the worker's run:"
        f" {chain.cpu_s / worker.cpu_s:.2f}x the worker's whole run)"
    )
    print(
        f"  loopwright's share  CPU {own * 1000:6.1f} ms per run  (the instance's less that"
        f" floor: {ratio:.2f}x the worker's, each round's {each}; goal <= {CPU_GOAL}x:"
        f" {'met' if ratio <= CPU_GOAL else 'MISSED'})"
    )
    serial = _median_cost([r.serial_engine for r in rounds])
    serial_chain = _median_cost([r.serial_chain for r in rounds])
    serial_ratio = statistics.median(r.serial_share for r in rounds)
    serial_own = statistics.median(r.serial_engine.cpu_s - r.serial_chain.cpu_s for r in rounds)
    serial_each = ", ".join(f"{r.serial_share:.2f}x" for r in rounds)
    print(
        "  one run at a time, as the worker runs them (Aegra's default above: up to 30 at once):"
        f" instance {serial.cpu_s * 1000:.1f} ms per run, the chain's floor"
        f" {serial_chain.cpu_s * 1000:.1f} ms; loopwright's share {serial_own * 1000:.1f} ms ="
        f" {serial_ratio:.2f}x the worker's, each round's {serial_each}; goal <= {CPU_GOAL}x:"
        f" {'met' if serial_ratio <= CPU_GOAL else 'MISSED'}; its {runs} runs created in"
        f" {serial.submitted_s:.2f} s"
    )
    print(
        f"  the worker's runs submitted    {worker.submit_cpu_s * 1000:6.1f} ms per run  (as"
        " `Runner.submit` does: the principal, the task's boundary checked with the orders"
        " service, the run registered; the work the instance's API does for a run it creates,"
        f" here in the submitting client): loopwright's share is {whole:.2f}x the worker's run"
        " and its submission together"
    )
    print(
        f"  {runs} runs created through the API: {submitted_s:.2f} s of client time"
        f" (goal <= {SUBMIT_GOAL_S} s: {'met' if submitted_s <= SUBMIT_GOAL_S else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
