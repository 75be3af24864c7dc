"""Tool-step wall time, loopwright against the bare prebuilt agent; a node commit against a raw
INSERT + COMMIT of the same bytes; the database work of a tool step. All side by side in this
one process, over many short runs interleaved, so that load on a shared machine falls on both.

    python -m benchmarks.step_time [--steps 10 100] [--rounds 15] [--max-rounds 60]
                                   [--backend postgres sqlite] [--db SERVER_URL]
                                   [--saves-in-place]

Both run the reading task (one model decision and one ~1 KB read per tool step, after the same
check that the order is the user's: two GETs) with the zero-latency scripted model, durability
"sync", against the same orders service: on Postgres with LangGraph's Postgres saver (for
the bare agent) and loopwright's own in its compact layout, and on SQLite with LangGraph's SQLite
saver and loopwright's. loopwright's tracing is off: the bare agent has none, and what tracing
costs is `benchmarks.tracing_overhead`'s. A
loopwright tool step is four committed nodes (compile_context, with guard's gate, model_step,
validate, execute), the bare agent's two (agent, tools).

Every round runs one bare run, one loopwright run (in alternating order) and a burst of raw
commits; each figure is the median over the rounds, with its spread (the median's 95% interval,
the interquartile range and the extremes), so that one slow moment on the machine does not
decide a ratio. Rounds go on past --rounds, up to --max-rounds, until the step ratio's median is
known to within 0.05 (its interval's width); a goal is met when the whole interval is within
it, missed when the whole interval is beyond it, and else "at the goal". Goals: loopwright /
bare per tool step <= 1.0x at 10 steps and <= 0.5x at 100; a node commit <= 1.5x a raw INSERT +
COMMIT of the same bytes, both timed alone, back to back (each round's loopwright commits are
replayed on a fresh run; their time inside the run is printed too). The database work of a tool
step (Postgres, counted on the wire, and the WAL the server wrote meanwhile, see
`benchmarks.db_work`) is the difference between a 50-step and a 25-step run, divided by 25, the
median of three such differences; goal: <= 4x the observation it carries, sent and in the WAL.
A run's work besides its tool steps is the 25-step run's less 25 tool steps', by phase of the
run (opening, registering, the tool steps' phase, the last supersteps, verification,
recording), each phase with what it holds; goal: no more transactions than the bare agent's,
or each one said why.
Beside each step ratio, what LangGraph's own work on the supersteps loopwright has more than the
bare agent costs at the least (`benchmarks.superstep_floor`, measured first, in this process):
the part of the ratio that only fewer supersteps could take away. Where a goal is not met the
script says where loopwright's time goes (cProfile, top functions).

Against the other durable choice: where DBOS Transact is installed (a dev dependency), each round
also runs the same work as DBOS's minimal durable workflow, each decision and each tool call a
checkpointed step (`benchmarks.dbos_flow`: its system database a fresh Postgres database on the
same server, or an SQLite file), and the same decisions and tool calls with no durability at
all; goal: loopwright / DBOS per tool step <= 1.0x at every length. What each costs above the
work itself is printed, loopwright's split into its node commits, LangGraph's superstep floor and
the rest; DBOS's database work a tool step beside loopwright's (Postgres); where loopwright's tool
step is not known to be within DBOS's, both profiles. DBOS keeps fewer guarantees: it records a
step's output after the step, so a step interrupted by a crash runs again, where loopwright
journals a write before sending it and fences every commit with the run's lease.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import enum
import functools
import pstats
import sqlite3
import statistics
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver

from benchmarks import dbos_flow
from benchmarks.db_work import DbWork, Mark, traced_connections, wal_position
from benchmarks.dbos_flow import Flow
from benchmarks.perf_setup import (
    PRINCIPAL,
    TASK,
    Bench,
    bare_agent,
    bare_tools,
    bench_environment,
    observation_bytes,
    open_reading_runner,
    reading_model,
    thread_bytes,
)
from benchmarks.spread import Spread, Verdict
from benchmarks.superstep_floor import SAVES, Floor, measure_floor, saves_in_place
from loopwright.checkpoints.compact import CompactSaver
from loopwright.checkpoints.database import connect_sqlite, sqlite_path
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.leases import LeaseStore, open_lease_store
from loopwright.checkpoints.sql import open_database
from loopwright.core import tls
from loopwright.graph.build import REDERIVABLE_NODES
from loopwright.observability.tracing import TraceSettings, configure_tracing
from loopwright.runner import Runner

STEP_GOALS = {10: 1.0, 100: 0.5}  # loopwright / bare per tool step, by run length
COMMIT_GOAL = 1.5
BYTES_GOAL = 4.0  # bytes a tool step sends, and writes to the WAL, / the observation's
DBOS_GOAL = 1.0  # loopwright / DBOS Transact per tool step, at every length
# Rounds go on past --rounds while the step ratio's median is known to less than this (the
# width of its 95% interval), up to --max-rounds.
SPREAD_GOAL = 0.05
MAX_ROUNDS_FACTOR = 4
LOOPWRIGHT_NODES_PER_STEP = 4
BARE_NODES_PER_STEP = 2
# Supersteps a run has besides its tool steps' and the bare agent's: its last compile_context
# and verify (both agents save the input and ask the model once more at the end).
EXTRA_RUN_SUPERSTEPS = 2
RAW_COMMITS_PER_ROUND = 30
WORK_STEPS = 25  # database work: a run of 2 * WORK_STEPS tool steps less one of WORK_STEPS
WORK_REPEATS = 3
WAL_HEADER = 32  # bytes before the first frame of SQLite's WAL
WAL_FRAME_HEADER = 24  # bytes before each page in SQLite's WAL
# What page 1 is to a commit: the file's header (its size, its change counter) on the schema's root.
HEADER_PAGE = "page 1 (the file's header)"

Call = tuple[str, tuple[Any, ...]]  # a saver method's name and its arguments


@dataclass
class CommitTimer:
    """Time spent in a saver's durable writes (put_writes and put), and how many puts there
    were: a node commit is one put (with loopwright, the node's writes are written in it).
    The calls, in order, for a replay."""

    seconds: float = 0.0
    puts: int = 0
    calls: list[Call] = field(default_factory=list)

    @property
    def per_put_ms(self) -> float:
        return 1000 * self.seconds / max(1, self.puts)


@contextmanager
def timed_commits(saver: BaseCheckpointSaver[Any]) -> Iterator[CommitTimer]:
    """Time the writes of `saver` and of every copy made of it while the block runs: a run
    writes through a copy fenced to its attempt's lease (`FencedSaver.fenced`), so the methods
    are wrapped on the saver's class (its instances alone: a subclass or a parent keeps its
    own), not on the instance, whose attributes a copy would carry unfenced."""
    timer = CommitTimer()
    cls = type(saver)
    originals = {name: cls.__dict__.get(name) for name in ("put", "put_writes")}

    def timed(name: str, counts: bool) -> Callable[..., Any]:
        write = getattr(cls, name)

        # Its signature is the method's: LangGraph passes `task_path` (which names the node)
        # only to a `put_writes` whose signature takes it.
        @functools.wraps(write)
        def call(self: BaseCheckpointSaver[Any], *args: Any) -> Any:
            timer.calls.append((name, args))
            started = time.perf_counter()
            try:
                return write(self, *args)
            finally:
                timer.seconds += time.perf_counter() - started
                timer.puts += counts

        return call

    cls.put = timed("put", True)  # type: ignore[method-assign]
    cls.put_writes = timed("put_writes", False)  # type: ignore[method-assign]
    try:
        yield timer
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


@dataclass(frozen=True)
class Backend:
    """Where both systems keep their checkpoints: the bench's Postgres database, or a file."""

    name: str
    url: str

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite:")

    @contextmanager
    def bare_saver(self) -> Iterator[BaseCheckpointSaver[Any]]:
        if self.is_sqlite:
            with closing(connect_sqlite(sqlite_path(self.url))) as conn:
                yield SqliteSaver(conn)
        else:
            with PostgresSaver.from_conn_string(self.url) as saver:
                saver.setup()
                yield saver

    def thread_bytes(self, thread: str) -> int:
        with open_database(self.url) as db:
            return thread_bytes(db, thread)

    def raw_commit_ms(self, payload_bytes: int, repeats: int = RAW_COMMITS_PER_ROUND) -> float:
        """One INSERT of `payload_bytes` and its COMMIT, in an explicit transaction on a fresh
        table, as the savers write (Postgres: BEGIN, INSERT, COMMIT; SQLite: BEGIN IMMEDIATE)."""
        payload = (bytes(range(256)) * (payload_bytes // 256 + 1))[:payload_bytes]
        if self.is_sqlite:
            with raw_sqlite_table(self.url) as (_conn, insert):
                started = time.perf_counter()
                insert(payload, repeats)
                elapsed = time.perf_counter() - started
            return 1000 * elapsed / repeats
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, payload bytea)")
            started = time.perf_counter()
            for _ in range(repeats):
                with conn.transaction():
                    conn.execute("INSERT INTO bench_raw (payload) VALUES (%s)", (payload,))
            elapsed = time.perf_counter() - started
            conn.execute("DROP TABLE bench_raw")
        return 1000 * elapsed / repeats


@contextmanager
def raw_sqlite_table(
    url: str,
) -> Iterator[tuple[sqlite3.Connection, Callable[[bytes, int], None]]]:
    """A fresh table on the SQLite file at `url` (dropped after), and how the raw commits write
    to it: `insert(payload, n)`, n times an INSERT in a BEGIN IMMEDIATE transaction of its own,
    as the SQLite saver writes."""
    with closing(connect_sqlite(sqlite_path(url))) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (payload BLOB)")
        conn.commit()

        def insert(payload: bytes, repeats: int) -> None:
            for _ in range(repeats):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO bench_raw (payload) VALUES (?)", (payload,))
                conn.commit()

        yield conn, insert
        conn.execute("DROP TABLE bench_raw")
        conn.commit()


def in_commit_order(calls: Sequence[Call]) -> list[Call]:
    """The calls with each superstep's writes before its checkpoint, as the saver commits them:
    in the run LangGraph may hand over the checkpoint first, and the saver waits for the writes
    (`checkpoints.fenced.WRITES_WAIT_S`), which a replay in the recorded order would never
    send while it waits."""
    put_at = {
        args[0]["configurable"].get("checkpoint_id"): i
        for i, (name, args) in enumerate(calls)
        if name == "put"
    }

    def place(i: int, call: Call) -> tuple[int, int]:
        name, (config, *_rest) = call
        checkpoint = put_at.get(config["configurable"].get("checkpoint_id"))
        if name == "put_writes" and checkpoint is not None and checkpoint < i:
            return checkpoint, 0  # just before the checkpoint it belongs to
        return i, 1

    return [
        call
        for _, call in sorted(((place(i, c), c) for i, c in enumerate(calls)), key=lambda t: t[0])
    ]


@contextmanager
def fresh_run(backend: Backend) -> Iterator[tuple[FencedSaver, LeaseStore, Callable[[Call], None]]]:
    """A fresh run of its own (registered, leased, the saver fenced), and how a recorded saver
    call is made again on it: `replay(call)`."""
    run_id = f"lw-replay-{time.time_ns()}"
    with open_lease_store(backend.url) as leases, open_checkpointer(backend.url) as saver:
        leases.register(run_id, task=TASK, user_id=PRINCIPAL.user_id)
        saver.fence = Fence.of(leases.claim(run_id, "bench", ttl_s=600))

        def replay(call: Call) -> None:
            name, (config, *rest) = call
            configurable = {**config["configurable"], "thread_id": run_id}
            getattr(saver, name)({**config, "configurable": configurable}, *rest)

        yield saver, leases, replay


def replayed_commit_ms(backend: Backend, calls: Sequence[Call]) -> float:
    """A loopwright run's commits again, back to back as the raw commits are, on a fresh run
    of their own: ms per put.

    The raw INSERTs are timed alone and back to back, so the commits are too. Inside a run the
    same commits take longer on average (printed beside): the run's other work between two
    commits leaves the caches cold (a replay with 2-4 ms of Python between commits: 0.50 ->
    0.64-0.70 ms on Postgres), and a run's first commits prepare the statement on its new
    connection (the replay's do too, on its own)."""
    seconds, puts = 0.0, 0
    with fresh_run(backend) as (_saver, _leases, replay):
        for call in in_commit_order(calls):
            started = time.perf_counter()
            replay(call)
            if call[0] == "put":
                seconds += time.perf_counter() - started
                puts += 1
    return 1000 * seconds / max(1, puts)


def wal_pages(
    path: Path, writers: Sequence[sqlite3.Connection], write: Callable[[], int]
) -> dict[str, float]:
    """WAL pages SQLite wrote per commit while `write` ran on `writers` (it returns how many
    commits it made), by the table or index each page belongs to: what an SQLite commit costs is
    mostly its pages (`synchronous=FULL`: all go to the WAL, then one fsync), so this says why
    one commit takes longer than another."""
    wal = path.with_name(path.name + "-wal")
    for conn in writers:
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the WAL only grows while measured
    with closing(connect_sqlite(str(path))) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        commits = write()
        frame = WAL_FRAME_HEADER + page_size
        data = wal.read_bytes()
        pages = [
            struct.unpack_from(">I", data, at)[0]
            for at in range(WAL_HEADER, len(data) - frame + 1, frame)
        ]
        # dbstat (a table and index per page) reads the WAL's pages too, while it is there.
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    owner[1] = HEADER_PAGE
    by_tree = Counter(owner.get(page, "free pages") for page in pages)
    return {tree: n / max(1, commits) for tree, n in by_tree.most_common()}


def sqlite_wal_pages(backend: Backend, calls: Sequence[Call], payload_bytes: int) -> WalPages:
    """WAL pages per commit of a run's commits replayed (as `replayed_commit_ms` does) and of
    the raw insert of as many bytes."""
    path = Path(sqlite_path(backend.url))
    with fresh_run(backend) as (saver, leases, replay):

        def replay_all() -> int:
            for call in in_commit_order(calls):
                replay(call)
            return sum(name == "put" for name, _ in calls)

        assert isinstance(saver, CompactSaver)
        writers = [saver.db.conn, leases.db.conn]
        ours = wal_pages(
            path, [c for c in writers if isinstance(c, sqlite3.Connection)], replay_all
        )
    with raw_sqlite_table(backend.url) as (conn, insert):

        def insert_all() -> int:
            insert(bytes(payload_bytes), RAW_COMMITS_PER_ROUND)
            return RAW_COMMITS_PER_ROUND

        raw = wal_pages(path, [conn], insert_all)
    return WalPages(sum(ours.values()), sum(raw.values()), ours)


@dataclass(frozen=True)
class WalPages:
    """WAL pages per commit (each a page and a frame header): a node commit's, the raw insert's,
    and a node commit's by the table or index they belong to."""

    commit: float
    raw: float
    commit_by_tree: dict[str, float]


@dataclass(frozen=True)
class Measured:
    seconds: float
    steps: int
    commits: CommitTimer
    bytes_written: int
    observation: int = 0  # the median observation's bytes, where the run was read back

    @property
    def per_step_ms(self) -> float:
        return 1000 * self.seconds / self.steps


def run_loopwright(
    bench: Bench,
    backend: Backend,
    steps: int,
    profile: cProfile.Profile | None = None,
    marks: list[Mark] | None = None,
) -> Measured:
    """A timed run; with `marks`, the run marks its phases in it (`LoopwrightPhase`), listening
    to its steps, which the timed runs do not."""
    run_id = f"lw-steps-{time.time_ns()}"
    mark = _marker(marks)
    mark(LoopwrightPhase.OPENING)
    with (
        open_reading_runner(backend.url, bench.endpoints, steps) as runner,
        timed_commits(runner.saver) as commits,
    ):
        on_step = _mark_phases(runner, steps, mark) if marks is not None else None
        mark(LoopwrightPhase.REGISTERING)
        started = time.perf_counter()
        # Since Python 3.12 cProfile hooks sys.monitoring, which sees every thread: LangGraph's
        # executor threads that run the nodes, and the pool execute runs tool calls on.
        if profile is not None:
            profile.enable()
        outcome = runner.start(TASK, PRINCIPAL, run_id=run_id, on_step=on_step)
        if profile is not None:
            profile.disable()
        elapsed = time.perf_counter() - started
        mark(BENCHMARK_READ)
        observation = observation_bytes(runner, run_id) if marks is not None else 0
    assert outcome.stop_reason == "completed", outcome.stop_detail
    return Measured(elapsed, steps, commits, backend.thread_bytes(run_id), observation)


class LoopwrightPhase(enum.StrEnum):
    """The phases of a loopwright run whose database work is counted apart, in order, and why
    each costs what it does beside the bare agent's run."""

    OPENING = "opening"
    REGISTERING = "registering"
    STEPS = "tool steps"
    LAST = "last supersteps"
    VERIFICATION = "verification"
    RECORDING = "recording"


# What each phase of a run is, and why its fixed work is there (printed beside its counts).
PHASE_WORK = {
    LoopwrightPhase.OPENING: "three connections (checkpoints, journal, leases; a worker opens "
    "them once, not per run), each setting UTC and reading the schema's versions (the "
    "checkpointer's: both layouts' in one statement)",
    LoopwrightPhase.REGISTERING: "the run's row inserted already leased: the fence every commit "
    "checks (the bare agent has no run and no lease: nothing fences its writes)",
    LoopwrightPhase.STEPS: "besides the tool steps: LangGraph's read of the thread's latest "
    "checkpoint, its input checkpoint and start superstep (the bare agent's too), and the commit "
    "statements prepared, one that waits for the disk and one that does not (a round trip "
    "each, once a connection)",
    LoopwrightPhase.LAST: "the context compiled once more and the model's answer, each a node "
    "commit (the bare agent commits its answer too)",
    LoopwrightPhase.VERIFICATION: "the verifier reads the journal (what the run did) and commits "
    "its verdict; the outcome reads the journal again for the run's actions",
    LoopwrightPhase.RECORDING: "the outcome recorded and the lease released, one statement",
}


# The benchmark's own reads after a run (what it stored, its observations): no phase of it.
BENCHMARK_READ = "the benchmark's read"


class BarePhase(enum.StrEnum):
    OPENING = "opening"
    RUN = "the run"


def _marker(marks: list[Mark] | None) -> Callable[[str], None]:
    """How a run marks where a phase begins: into `marks`, or nowhere."""
    if marks is None:
        return lambda _phase: None
    return lambda phase: marks.append((time.time(), phase))


def _mark_phases(
    runner: Runner, steps: int, mark: Callable[[str], None]
) -> Callable[[str, dict[str, Any]], None]:
    """Mark the phases of a run of `steps` tool steps on `runner`: the tool steps begin when its
    row is registered, the last supersteps after the last tool step's execute, verification after
    the model's answer, recording when the outcome is recorded. Returns the step listener."""
    leases = runner.leases
    begin, record = leases.begin, leases.record

    def begun(*args: Any, **kwargs: Any) -> Any:
        try:
            return begin(*args, **kwargs)
        finally:
            mark(LoopwrightPhase.STEPS)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        mark(LoopwrightPhase.RECORDING)
        return record(*args, **kwargs)

    leases.begin = begun  # type: ignore[method-assign]
    leases.record = recorded  # type: ignore[method-assign]
    executed = 0

    def on_step(node: str, _update: dict[str, Any]) -> None:
        nonlocal executed
        executed += node == "execute"
        if node == "execute" and executed == steps:
            mark(LoopwrightPhase.LAST)
        elif node == "model_step" and executed == steps:
            mark(LoopwrightPhase.VERIFICATION)

    return on_step


def run_bare(
    bench: Bench, backend: Backend, steps: int, marks: list[Mark] | None = None
) -> Measured:
    thread = f"bare-steps-{time.time_ns()}"
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 10**6}
    mark = _marker(marks)
    mark(BarePhase.OPENING)
    with (
        backend.bare_saver() as saver,
        httpx.Client(verify=tls.context()) as client,
        timed_commits(saver) as commits,
    ):
        agent = bare_agent(reading_model(steps), bare_tools(bench.endpoints, client), saver)
        mark(BarePhase.RUN)
        started = time.perf_counter()
        agent.invoke({"messages": [HumanMessage(TASK)]}, config, durability="sync")
        elapsed = time.perf_counter() - started
    mark(BENCHMARK_READ)
    return Measured(elapsed, steps, commits, backend.thread_bytes(thread))


@dataclass(frozen=True)
class Length:
    """One backend and run length: every round's figures."""

    backend: str
    steps: int
    loopwright_ms: Spread
    bare_ms: Spread
    step_ratio: Spread
    commit_ms: Spread
    bare_commit_ms: Spread
    raw_ms: Spread
    replayed_ms: Spread
    commit_ratio: Spread  # replayed / raw: the commit alone against the INSERT alone
    commit_bytes: int
    wal: WalPages | None  # SQLite only
    dbos: Versus | str  # DBOS Transact's figures, or why it was not timed

    @property
    def step_goal(self) -> float | None:
        return STEP_GOALS.get(self.steps)

    @property
    def extra_supersteps(self) -> float:
        """How many more supersteps loopwright runs than the bare agent, per tool step."""
        return LOOPWRIGHT_NODES_PER_STEP - BARE_NODES_PER_STEP + EXTRA_RUN_SUPERSTEPS / self.steps

    @property
    def verdicts(self) -> list[Verdict]:
        goal = self.step_goal
        step = [Verdict.of(self.step_ratio, goal)] if goal is not None else []
        dbos = [Verdict.of(self.dbos.ratio, DBOS_GOAL)] if isinstance(self.dbos, Versus) else []
        return [*step, Verdict.of(self.commit_ratio, COMMIT_GOAL), *dbos]


@dataclass(frozen=True)
class Versus:
    """DBOS Transact doing the same work in the same rounds, and the same work done with no
    durability at all: what each system costs above it, each round's difference."""

    dbos_ms: Spread
    ratio: Spread  # loopwright / DBOS per tool step, each round's
    plain_ms: Spread
    loopwright_above: Spread  # loopwright's tool step less the plain one's, ms
    dbos_above: Spread
    version: str
    where: str


@dataclass(frozen=True)
class Work:
    """Database work per tool step on Postgres, as the wire shows it, and a run's besides its
    tool steps (a run of WORK_STEPS less WORK_STEPS tool steps' work), by phase of the run."""

    loopwright: DbWork
    loopwright_commits: float
    bare: DbWork
    bare_commits: float
    loopwright_run: dict[str, DbWork]
    bare_run: dict[str, DbWork]
    observation: int  # a tool step's observation (the median), bytes as the model sees it
    dbos: DbWork | str  # DBOS's, or why it was not counted
    dbos_run: dict[str, DbWork]

    def to_observation(self, work_bytes: int) -> float:
        """Bytes of a tool step's work over the observation it carries."""
        return work_bytes / WORK_STEPS / max(1, self.observation)


@dataclass
class StepFigures:
    lengths: list[Length] = field(default_factory=list)
    work: Work | None = None
    floor: Floor | None = None
    profile: cProfile.Profile | None = None
    # Where loopwright's tool step was first not known to be within DBOS's: a run of each
    # profiled, loopwright's and DBOS's.
    dbos_profiles: tuple[Length, cProfile.Profile, cProfile.Profile] | None = None

    @property
    def first_unmet(self) -> Length | None:
        """The first backend and length that did not meet a goal for sure, if any."""
        return next(
            (
                length
                for length in self.lengths
                if any(v is not Verdict.MET for v in length.verdicts)
            ),
            None,
        )


def measure_length(
    bench: Bench,
    backend: Backend,
    steps: int,
    rounds: int,
    max_rounds: int,
    flow: Flow | str = dbos_flow.NOT_INSTALLED,
) -> Length:
    """At least `rounds` rounds, and more (up to `max_rounds`) while the step ratio's median is
    known to less than SPREAD_GOAL (the width of its 95% interval). A round runs each system
    once, the first of them in turn: the bare agent, loopwright and, with a launched `flow`,
    DBOS's workflow and the same work with no durability."""
    run_loopwright(bench, backend, min(steps, 5))  # warm: imports, connections, caches
    run_bare(bench, backend, min(steps, 5))
    ours: list[Measured] = []
    bare: list[Measured] = []
    dbos: list[float] = []
    plain: list[float] = []
    raw: list[float] = []
    replayed: list[float] = []
    runs: list[Callable[[], None]] = [
        lambda: bare.append(run_bare(bench, backend, steps)),
        lambda: ours.append(run_loopwright(bench, backend, steps)),
    ]
    if isinstance(flow, Flow):
        for warm in (flow.run, flow.plain):
            tool_step_ms(warm, min(steps, 5))
        runs += [
            lambda: dbos.append(tool_step_ms(flow.run, steps)),
            lambda: plain.append(tool_step_ms(flow.plain, steps)),
        ]

    def spread_too_wide() -> bool:
        low, high = Spread(tuple(_ratios(ours, bare))).interval
        return high - low > SPREAD_GOAL

    n = 0
    while n < rounds or (n < max_rounds and spread_too_wide()):
        for one in runs[n % len(runs) :] + runs[: n % len(runs)]:
            one()
        commit_bytes = ours[-1].bytes_written // max(1, ours[-1].commits.puts)
        raw.append(backend.raw_commit_ms(commit_bytes))
        replayed.append(replayed_commit_ms(backend, ours[-1].commits.calls))
        n += 1
    return Length(
        backend=backend.name,
        steps=steps,
        loopwright_ms=Spread(tuple(m.per_step_ms for m in ours)),
        bare_ms=Spread(tuple(m.per_step_ms for m in bare)),
        step_ratio=Spread(tuple(_ratios(ours, bare))),
        commit_ms=Spread(tuple(m.commits.per_put_ms for m in ours)),
        bare_commit_ms=Spread(tuple(m.commits.per_put_ms for m in bare)),
        raw_ms=Spread(tuple(raw)),
        replayed_ms=Spread(tuple(replayed)),
        commit_ratio=Spread(tuple(c / r for c, r in zip(replayed, raw, strict=True))),
        commit_bytes=commit_bytes,
        wal=sqlite_wal_pages(backend, ours[-1].commits.calls, commit_bytes)
        if backend.is_sqlite
        else None,
        dbos=_versus(flow, ours, dbos, plain),
    )


def tool_step_ms(run: Callable[[int], int], steps: int) -> float:
    """One run of `steps` tool steps by `run` (it returns how many tool calls it made): its
    wall time, ms per tool step."""
    started = time.perf_counter()
    calls = run(steps)
    elapsed = time.perf_counter() - started
    assert calls == steps, f"{calls} tool calls, not {steps}"
    return 1000 * elapsed / steps


def _versus(
    flow: Flow | str, ours: Sequence[Measured], dbos: Sequence[float], plain: Sequence[float]
) -> Versus | str:
    """DBOS's figures from each round's times, or why there are none."""
    if isinstance(flow, str):
        return flow
    ours_ms = [m.per_step_ms for m in ours]
    return Versus(
        dbos_ms=Spread(tuple(dbos)),
        ratio=Spread(tuple(o / d for o, d in zip(ours_ms, dbos, strict=True))),
        plain_ms=Spread(tuple(plain)),
        loopwright_above=Spread(tuple(o - p for o, p in zip(ours_ms, plain, strict=True))),
        dbos_above=Spread(tuple(d - p for d, p in zip(dbos, plain, strict=True))),
        version=flow.version,
        where=flow.where,
    )


def _behind_dbos(length: Length) -> bool:
    """Whether loopwright's tool step was not known to be within DBOS's at this length."""
    versus = length.dbos
    return isinstance(versus, Versus) and Verdict.of(versus.ratio, DBOS_GOAL) is not Verdict.MET


def _ratios(ours: Sequence[Measured], bare: Sequence[Measured]) -> list[float]:
    """Each round's loopwright / bare per tool step."""
    return [o.per_step_ms / b.per_step_ms for o, b in zip(ours, bare, strict=True)]


def measure_work(bench: Bench, backend: Backend, dbos_url: str) -> Work:
    """Wire counts of a 2k-step run less a k-step one, per tool step, for every system (DBOS's
    with its system database at `dbos_url`, where it runs); and by phase, a k-step run's less k
    tool steps' (2 short - long)."""

    def traced(run: Callable[[int, list[Mark]], Measured], steps: int) -> tuple[Phases, Measured]:
        start = wal_position(backend.url)  # read on a connection of its own, not traced
        marks: list[Mark] = []
        with (
            tempfile.TemporaryDirectory(prefix="lw-wire-") as tmp,
            traced_connections(Path(tmp)) as traces,
        ):
            measured = run(steps, marks)
            work = traces.phases(marks)
            work.pop(BENCHMARK_READ, None)
        wal = wal_position(backend.url) - start
        # The WAL is the whole run's: it goes with the tool steps' phase, which holds them.
        work[marks[1][1]] = replace(work.get(marks[1][1], DbWork()), wal_bytes=wal)
        return work, measured

    def per_step(
        run: Callable[[int, list[Mark]], Measured],
    ) -> tuple[DbWork, float, dict[str, DbWork], int]:
        """The median, field by field, of WORK_REPEATS differences: a trace now and then comes
        back short (libpq's buffered trace stream), which one difference would take for less
        work."""
        differences, commits = [], []
        fixed: dict[str, list[DbWork]] = {}
        for _ in range(WORK_REPEATS):
            short, short_run = traced(run, WORK_STEPS)
            long, long_run = traced(run, 2 * WORK_STEPS)
            differences.append(_total(long) - _total(short))
            for phase in dict.fromkeys([*short, *long]):
                less = short.get(phase, DbWork()) - long.get(phase, DbWork())
                fixed.setdefault(phase, []).append(short.get(phase, DbWork()) + less)
            commits.append((long_run.commits.puts - short_run.commits.puts) / WORK_STEPS)
        by_phase = {phase: DbWork.median(works) for phase, works in fixed.items()}
        observation = long_run.observation
        return DbWork.median(differences), statistics.median(commits), by_phase, observation

    ours, ours_commits, ours_run, observation = per_step(
        lambda steps, marks: run_loopwright(bench, backend, steps, marks=marks)
    )
    bare, bare_commits, bare_run, _ = per_step(
        lambda steps, marks: run_bare(bench, backend, steps, marks)
    )
    dbos: DbWork | str = dbos_flow.unavailable(dbos_url) or DbWork()
    dbos_run: Phases = {}
    if isinstance(dbos, DbWork):
        dbos, _, dbos_run, _ = per_step(
            lambda steps, marks: run_dbos(bench, dbos_url, steps, marks)
        )
    return Work(
        ours, ours_commits, bare, bare_commits, ours_run, bare_run, observation, dbos, dbos_run
    )


class DbosPhase(enum.StrEnum):
    OPENING = "launch"
    RUN = "the run"
    CLOSING = "shutdown"


def run_dbos(bench: Bench, system_url: str, steps: int, marks: list[Mark]) -> Measured:
    """DBOS launched, one workflow of `steps` tool steps run, DBOS shut down, each phase marked
    (a launch's connections are opened inside the block that traces them)."""
    mark = _marker(marks)
    mark(DbosPhase.OPENING)
    with dbos_flow.launched(system_url, bench.endpoints) as flow:
        assert isinstance(flow, Flow), flow
        mark(DbosPhase.RUN)
        elapsed_ms = tool_step_ms(flow.run, steps) * steps
        mark(DbosPhase.CLOSING)
    return Measured(elapsed_ms / 1000, steps, CommitTimer(), bytes_written=0)


Phases = dict[str, DbWork]


def _total(phases: Phases) -> DbWork:
    return sum(phases.values(), DbWork())


def measure(
    bench: Bench,
    lengths: Sequence[int],
    rounds: int,
    backends: Sequence[str],
    max_rounds: int | None = None,
) -> StepFigures:
    """Every length on every backend: `rounds` rounds at least, `max_rounds` (by default four
    times as many) at most."""
    figures = StepFigures()
    most = max(rounds, max_rounds if max_rounds is not None else MAX_ROUNDS_FACTOR * rounds)
    # The bare agent traces nothing; what tracing costs is `benchmarks.tracing_overhead`'s.
    configure_tracing(TraceSettings(enabled=False))
    figures.floor = measure_floor()
    with tempfile.TemporaryDirectory(prefix="lw-steps-") as tmp:
        chosen = [
            Backend("postgres", bench.database_url),
            Backend("sqlite", f"sqlite:///{Path(tmp) / 'bench.sqlite3'}"),
        ]
        for backend in [b for b in chosen if b.name in backends]:
            _measure_backend(figures, bench, backend, lengths, rounds, most, Path(tmp))
        unmet = figures.first_unmet
        if unmet is not None:
            # The profiler slows the run down: a run of its own, after the timed ones, on the
            # backend and at the length that did not meet its goal.
            figures.profile = cProfile.Profile()
            backend = next(b for b in chosen if b.name == unmet.backend)
            run_loopwright(bench, backend, unmet.steps, figures.profile)
    return figures


def _measure_backend(
    figures: StepFigures,
    bench: Bench,
    backend: Backend,
    lengths: Sequence[int],
    rounds: int,
    max_rounds: int,
    tmp: Path,
) -> None:
    """Every length on `backend`, DBOS launched beside loopwright on a database of its own;
    where loopwright's tool step is first not known to be within DBOS's, a run of each profiled;
    on Postgres, the database work a tool step."""
    with dbos_flow.system_database(backend.url, tmp) as dbos_url:
        with dbos_flow.launched(dbos_url, bench.endpoints) as flow:
            measured = [
                measure_length(bench, backend, steps, rounds, max_rounds, flow) for steps in lengths
            ]
            behind = next((m for m in measured if _behind_dbos(m)), None)
            theirs = cProfile.Profile()
            if behind is not None and isinstance(flow, Flow) and figures.dbos_profiles is None:
                # DBOS's run profiled while it is launched (one per process), loopwright's
                # once DBOS's threads are gone.
                theirs.runcall(flow.run, behind.steps)
                figures.dbos_profiles = (behind, cProfile.Profile(), theirs)
        figures.lengths += measured
        if figures.dbos_profiles is not None and figures.dbos_profiles[0] is behind:
            run_loopwright(bench, backend, behind.steps, figures.dbos_profiles[1])
        if not backend.is_sqlite:
            figures.work = measure_work(bench, backend, dbos_url)


# Where a thread only waits for another (LangGraph's stream waiting for its executor), or sleeps
# (DBOS's background threads between polls): not work.
WAITING = ("SimpleQueue' objects>", "lock' objects>", "threading.py", "time.sleep>")


def top_functions(profile: cProfile.Profile | str, limit: int = 15) -> str:
    """The functions with the most own time over every thread, waits for other threads left out
    (`profile`: a profile, or the file a profiled process wrote)."""
    stats = pstats.Stats(profile)
    rows = [
        (tottime, calls, f"{func[0]}:{func[1]}({func[2]})")
        for func, (_cc, calls, tottime, _ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    rows = [row for row in rows if not any(w in row[2] for w in WAITING)]
    rows.sort(reverse=True)
    return "\n".join(
        f"  {1000 * tottime:9.1f} ms {calls:8d} calls  {name}"
        for tottime, calls, name in rows[:limit]
    )


def _verdict(spread: Spread, goal: float | None) -> str:
    if goal is None:
        return "(no goal at this length)"
    return f"(goal <= {goal}x) {Verdict.of(spread, goal).value}"


def report(figures: StepFigures) -> list[str]:
    floor = figures.floor
    lines: list[str] = [floor.show()] if floor is not None else []
    for length in figures.lengths:
        lines += [
            f"{length.backend}, {length.steps} steps: tool step loopwright "
            f"{length.loopwright_ms.show(' ms', 1)}, bare prebuilt agent "
            f"{length.bare_ms.show(' ms', 1)}",
            f"  ratio loopwright / bare {length.step_ratio.show('x')} "
            f"{_verdict(length.step_ratio, length.step_goal)}",
            f"  node commit (one transaction: the node's writes, the checkpoint, the fence check) "
            f"of {length.commit_bytes} bytes, the run's commits replayed back to back, each "
            f"waiting for the disk as the raw one does, {length.replayed_ms.show(' ms')}; raw "
            f"INSERT + COMMIT of as many bytes {length.raw_ms.show(' ms')}",
            f"  ratio node commit / raw {length.commit_ratio.show('x')} "
            f"{_verdict(length.commit_ratio, COMMIT_GOAL)}",
            f"  the same commits inside the run: {length.commit_ms.show(' ms')} (wall time; "
            f"there those of {', '.join(sorted(REDERIVABLE_NODES))} do not wait for the disk)",
            *(
                [
                    f"  WAL pages a commit: node commit {length.wal.commit:.1f} ("
                    + ", ".join(f"{t} {n:.2f}" for t, n in length.wal.commit_by_tree.items())
                    + f"), raw insert {length.wal.raw:.1f} (a node commit's row goes to a "
                    f"table and its primary key's index, the raw insert's to a table alone; "
                    f"the replayed run's keys sort among other runs', as random run ids do, "
                    f"where a full leaf of the index is rebalanced with its neighbours)"
                ]
                if length.wal
                else []
            ),
            f"  a loopwright tool step commits {LOOPWRIGHT_NODES_PER_STEP} nodes: "
            f"{LOOPWRIGHT_NODES_PER_STEP * length.commit_ms.median:.1f} ms of its "
            f"{length.loopwright_ms.median:.1f} ms; the bare agent commits {BARE_NODES_PER_STEP} "
            f"at {length.bare_commit_ms.median:.2f} ms each (stock saver, its whole message list "
            f"in every commit)",
            *_floor_line(floor, length),
            *_dbos_lines(floor, length),
        ]
    if figures.work is not None:
        work = figures.work
        lines += [
            f"database work per tool step (postgres, on the wire and in its WAL, a "
            f"{2 * WORK_STEPS}-step run less a {WORK_STEPS}-step one):",
            f"  loopwright: {work.loopwright.per(WORK_STEPS)}, in "
            f"{work.loopwright_commits:.1f} node commits",
            f"  bytes a tool step / the observation's {work.observation:,} B: sent "
            f"{_bytes_verdict(work.to_observation(work.loopwright.bytes_sent))}, WAL "
            f"{_bytes_verdict(work.to_observation(work.loopwright.wal_bytes))}",
            f"  the least the card's boundaries need: {LOOPWRIGHT_NODES_PER_STEP} transactions "
            f"and {LOOPWRIGHT_NODES_PER_STEP} round trips (a commit after each of "
            f"{LOOPWRIGHT_NODES_PER_STEP} nodes, one round trip each)",
            f"  bare prebuilt agent: {work.bare.per(WORK_STEPS)}, in {work.bare_commits:.1f} "
            f"node commits",
            *_dbos_work_lines(work),
            "a run's besides its tool steps, by phase (a run of "
            f"{WORK_STEPS} steps less {WORK_STEPS} tool steps' work):",
            *_phase_lines(work),
        ]
    unmet = figures.first_unmet
    if figures.profile is not None and unmet is not None:
        lines += [
            f"where loopwright's time goes ({unmet.backend}, {unmet.steps} steps; cProfile "
            "over every thread, own time, a thread's wait for another left out):",
            top_functions(figures.profile),
        ]
    if figures.dbos_profiles is not None:
        length, ours, theirs = figures.dbos_profiles
        lines += [
            f"what stands between loopwright and DBOS ({length.backend}, {length.steps} steps, "
            "a run of each profiled as above): loopwright's",
            top_functions(ours),
            "  and DBOS's:",
            top_functions(theirs),
        ]
    return lines


def _dbos_lines(floor: Floor | None, length: Length) -> list[str]:
    """DBOS's tool step beside loopwright's, and what each costs above the same work done with
    no durability: where loopwright's is the longer, what stands between them."""
    versus = length.dbos
    if isinstance(versus, str):
        return [f"  DBOS Transact not timed: {versus}"]
    commits = LOOPWRIGHT_NODES_PER_STEP * length.commit_ms.median
    supersteps = floor.cost_ms(LOOPWRIGHT_NODES_PER_STEP) if floor is not None else 0.0
    hand_offs = LOOPWRIGHT_NODES_PER_STEP * floor.hand_offs_ms if floor is not None else 0.0
    ours, theirs = versus.loopwright_above.median, versus.dbos_above.median
    return [
        f"  DBOS Transact {versus.version} (its minimal durable workflow, each decision and "
        f"each tool call a step; {versus.where}): tool step {versus.dbos_ms.show(' ms', 1)}",
        f"  ratio loopwright / DBOS {versus.ratio.show('x')} {_verdict(versus.ratio, DBOS_GOAL)}",
        f"  above the same decisions and tool calls made with no durability "
        f"({versus.plain_ms.median:.1f} ms a tool step): loopwright {ours:.1f} ms, DBOS "
        f"{theirs:.1f} ms ({dbos_flow.STEPS_PER_TOOL_STEP} steps, "
        f"{theirs / dbos_flow.STEPS_PER_TOOL_STEP:.2f} ms each)",
        f"  loopwright's {ours:.1f} ms: its {LOOPWRIGHT_NODES_PER_STEP} node commits "
        f"{commits:.1f} ms, LangGraph's own work on its {LOOPWRIGHT_NODES_PER_STEP} supersteps "
        f"at least {supersteps:.1f} ms ({hand_offs:.1f} of it handing their saves to its "
        f"thread pool and waiting), the rest {ours - commits - supersteps:.1f} ms (its "
        f"nodes' own work, and LangGraph's on a real state beyond a no-op chain's)",
    ]


def _dbos_work_lines(work: Work) -> list[str]:
    """DBOS's database work a tool step and a run's besides, beside loopwright's."""
    if isinstance(work.dbos, str):
        return [f"  DBOS Transact not counted: {work.dbos}"]
    run = work.dbos_run.get(DbosPhase.RUN, DbWork())
    return [
        f"  DBOS Transact: {work.dbos.per(WORK_STEPS)}, in {dbos_flow.STEPS_PER_TOOL_STEP} "
        f"steps (each a transaction reading the workflow's status and the step's recorded "
        f"output, if any, and one writing its output; before each the pooled connection is "
        f"pinged, a statement in a transaction of its own; its background threads' polls "
        f"while the run lasts included)",
        f"  DBOS Transact's run besides its tool steps: {_counts(run)} (its launch and shutdown, "
        f"once a process: {_counts(work.dbos_run.get(DbosPhase.OPENING, DbWork()))} and "
        f"{_counts(work.dbos_run.get(DbosPhase.CLOSING, DbWork()))})",
    ]


def _floor_line(floor: Floor | None, length: Length) -> list[str]:
    """What LangGraph's own work on loopwright's extra supersteps costs a tool step, at least."""
    if floor is None:
        return []
    extra = length.extra_supersteps
    cost = floor.cost_ms(extra)
    return [
        f"  LangGraph's own work on loopwright's {extra:.1f} more supersteps a tool step: at "
        f"least {cost:.1f} ms, {cost / length.bare_ms.median:.2f}x the bare agent's step"
    ]


def _counts(work: DbWork) -> str:
    """A run's fixed work without its bytes: the bare agent's bytes grow faster than its steps
    (its whole message list in every commit), so its difference says nothing of a run's."""
    return (
        f"{work.transactions} transactions, {work.round_trips} round trips, "
        f"{work.statements} statements"
    )


def _bytes_verdict(ratio: float) -> str:
    return f"{ratio:.2f}x (goal <= {BYTES_GOAL}x) {'met' if ratio <= BYTES_GOAL else 'MISSED'}"


def _phase_lines(work: Work) -> list[str]:
    """Each phase's fixed work, loopwright's with why it is there, and both totals against the
    goal (no more transactions than the bare agent's, or each one said why)."""
    ours, bare = _total(work.loopwright_run), _total(work.bare_run)
    within = ours.transactions <= bare.transactions
    lines = [
        f"  loopwright {phase}: {_counts(work.loopwright_run.get(phase, DbWork()))}; "
        f"{PHASE_WORK[phase]}"
        for phase in LoopwrightPhase
    ]
    lines += [
        f"  bare prebuilt agent {phase}: {_counts(work.bare_run.get(phase, DbWork()))}"
        for phase in BarePhase
    ]
    return [
        *lines,
        f"  in all: loopwright {_counts(ours)}; bare prebuilt agent {_counts(bare)} "
        f"(goal: no more transactions than the bare agent's, or each said why above) "
        f"{'met' if within else 'each said why'}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100])
    parser.add_argument(
        "--rounds", type=int, default=15, help="interleaved rounds per length, at least"
    )
    parser.add_argument(
        "--max-rounds",
        type=int,
        help="rounds per length at most, while the step ratio's 95%% interval is wider than "
        f"{SPREAD_GOAL} (default: {MAX_ROUNDS_FACTOR} times --rounds)",
    )
    parser.add_argument(
        "--backend", nargs="+", choices=["postgres", "sqlite"], default=["postgres", "sqlite"]
    )
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    parser.add_argument(
        "--saves-in-place",
        action="store_true",
        help="what LangGraph's hand-off of each superstep's saves to its thread pool costs: "
        "run them on the loop's thread instead, for both agents (a measurement, never how the "
        "runtime runs LangGraph)",
    )
    args = parser.parse_args(argv)
    in_place = saves_in_place() if args.saves_in_place else contextlib.nullcontext()
    with bench_environment(args.db) as bench, in_place:
        figures = measure(bench, args.steps, args.rounds, args.backend, args.max_rounds)
    if args.saves_in_place:
        print(f"LangGraph's saves ran on the loop's thread ({', '.join(sorted(SAVES))}):")
    print("\n".join(report(figures)))


if __name__ == "__main__":
    main()
