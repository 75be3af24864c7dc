"""Where worker processes' time goes, sampled from outside: no change to the runtime's code.

Every `INTERVAL_S` a thread looks at each worker process (Linux /proc, x86_64) and at its
Postgres backends (pg_stat_activity, by application name) and notes what each is doing:

- the worker: on a CPU or runnable (its main thread out of any system call, or another of its
  threads), blocked on a socket to Postgres, blocked on a socket to the reference services, or
  neither (sleeping between polls for due runs, or waiting on a lock of its own). A thread
  blocked in poll(2) is matched to its socket by reading the pollfd it passed (/proc/PID/mem,
  allowed for a child), and the socket to its peer port (/proc/net/tcp; a Unix socket is
  Postgres'). "Runnable" is split
  into running and waiting for a CPU by the main thread's /proc/PID/schedstat;
- its backends: executing, waiting on a lock (another transaction holds the row), waiting on
  the WAL (a commit's flush), or idle inside an open transaction.

Every `CPU_EVERY` samples it also notes CPU seconds so far: the machine's (/proc/stat), the time
some task waited for a CPU (/proc/pressure/cpu), and each group of processes it is given.
Shares are then taken over any window of the sampled time (`Samples.window`).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

INTERVAL_S = 0.02
CPU_EVERY = 5
POLL, PPOLL, READ, RECVFROM = 7, 271, 0, 45  # x86_64 system call numbers
UNIX = -1  # a Unix socket's "port": a worker's only ones go to Postgres
# What a worker can be doing, most telling first: a sample takes the first that applies.
WORKER_STATES = ("cpu", "database", "services", "idle")
BACKEND_STATES = ("lock", "wal", "executing", "idle in transaction")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The workers' backends, as named by their application name.
ACTIVITY = (
    "SELECT application_name, state, wait_event_type, wait_event FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name LIKE %s"
)


def process_cpu_s(pid: int, *, main_thread: bool = False) -> float:
    """User + system CPU seconds of a process so far, all its threads, or with `main_thread`
    that thread's alone (0 once it is gone)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat")
    try:
        fields = stat.read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent on anything but idling and waiting for IO."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK  # all but idle and iowait


def _cpu_pressure_s() -> float:
    """Seconds during which at least one task waited for a CPU (0 without PSI)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0]
    except OSError:
        return 0.0
    return int(some.rpartition("total=")[2]) / 1e6


def _schedstat(pid: int) -> tuple[float, float]:
    """Seconds the main thread has run, and waited on a run queue to run."""
    try:
        ran, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


class _Sockets:
    """Which peer a worker's file descriptor talks to: 'database', 'services' or None."""

    def __init__(self, database_port: int, service_ports: set[int]) -> None:
        self.database_port = database_port
        self.service_ports = service_ports
        self.peers: dict[str, int] = {}  # socket inode -> remote TCP port, or UNIX

    def kind(self, pid: int, fd: int) -> str | None:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            return None
        if not link.startswith("socket:["):
            return None
        inode = link[8:-1]
        if inode not in self.peers:
            self._reload()
        port = self.peers.get(inode)
        if port in (self.database_port, UNIX):
            return "database"
        return "services" if port in self.service_ports else None

    def _reload(self) -> None:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            self.peers[line.split()[6]] = UNIX
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                self.peers[parts[9]] = int(parts[2].rpartition(":")[2], 16)


def _thread_state(pid: int, tid: str, sockets: _Sockets) -> str:
    """What one thread of a worker is doing (see WORKER_STATES)."""
    try:
        call = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
    except OSError:
        return "idle"  # gone meanwhile
    if not call or call[0] == "running":
        return "cpu"
    number, args = int(call[0]), [int(a, 16) for a in call[1:7]]
    fd: int | None = None
    if number in (POLL, PPOLL) and args[1] >= 1:
        try:
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(args[0])
                fd = struct.unpack("i", mem.read(4))[0]  # struct pollfd's first member
        except (OSError, struct.error, OverflowError):
            fd = None
    elif number in (READ, RECVFROM):
        fd = args[0]
    return (sockets.kind(pid, fd) if fd is not None else None) or "idle"


def worker_state(pid: int, sockets: _Sockets) -> str:
    """What a worker process is doing now: its main thread's state, or, if that waits on
    nothing this can tell (a futex, a sleep), the most telling of its other threads'."""
    main = _thread_state(pid, str(pid), sockets)
    if main != "idle":
        return main
    try:
        others = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return "idle"
    states = {_thread_state(pid, tid, sockets) for tid in others}
    return next((s for s in WORKER_STATES if s in states), "idle")


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def backend_state(state: str | None, wait_type: str | None, wait_event: str | None) -> str | None:
    """What a backend of pg_stat_activity is doing (see BACKEND_STATES), None when idle."""
    if state == "active":
        if wait_type == "Lock":
            return "lock"
        if wait_event and wait_event.startswith("WAL"):
            return "wal"
        return "executing"
    return "idle in transaction" if state and state.startswith("idle in transaction") else None


@dataclass
class Samples:
    """What the sampler saw: per worker and moment, its state and its backends'; and CPU
    snapshots (moment, {group or 'machine' or 'pressure': seconds so far})."""

    moments: list[float] = field(default_factory=list)
    workers: list[list[str]] = field(default_factory=list)
    backends: list[list[set[str]]] = field(default_factory=list)
    schedstats: list[list[tuple[float, float]]] = field(default_factory=list)
    cpu: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    sampler_cpu_s: float = 0.0

    def window(self, start: float, end: float) -> Window:
        """Shares of each state over the samples taken between `start` and `end`."""
        picked = [i for i, t in enumerate(self.moments) if start <= t <= end]
        n = max(1, len(picked)) * max(1, len(self.workers[0]) if self.workers else 1)
        worker = Counter(s for i in picked for s in self.workers[i])
        backend = Counter(
            next((b for b in BACKEND_STATES if b in states), "none")
            for i in picked
            for states in self.backends[i]
        )
        first, last = (picked[0], picked[-1]) if picked else (0, 0)
        span = self.moments[last] - self.moments[first] if picked else 0.0
        waited = sum(
            after[1] - before[1]
            for before, after in zip(self.schedstats[first], self.schedstats[last], strict=True)
        )
        ran = sum(
            after[0] - before[0]
            for before, after in zip(self.schedstats[first], self.schedstats[last], strict=True)
        )
        inside = [(t, c) for t, c in self.cpu if start <= t <= end]
        cpu: dict[str, float] = {}
        cpu_span = 0.0
        if len(inside) >= 2:
            (t0, c0), (t1, c1) = inside[0], inside[-1]
            cpu_span = t1 - t0
            cpu = {k: (c1[k] - c0[k]) / cpu_span for k in c0}
        return Window(
            samples=len(picked),
            worker={s: worker[s] / n for s in WORKER_STATES},
            backend={s: backend[s] / n for s in BACKEND_STATES},
            # Of the time the main threads were runnable, the part spent waiting for a CPU.
            runqueue_share=waited / (ran + waited) if ran + waited else 0.0,
            runqueue_per_worker=waited / span / max(1, len(self.schedstats[0])) if span else 0.0,
            cpu_per_s=cpu,
        )


@dataclass(frozen=True)
class Window:
    samples: int
    worker: Mapping[str, float]  # share of the workers' time in each state
    backend: Mapping[str, float]  # share of the workers' time their backends were in each
    runqueue_share: float
    runqueue_per_worker: float  # share of a worker's time its main thread waited for a CPU
    cpu_per_s: Mapping[str, float]  # CPU seconds a second: each group, 'machine', 'pressure'


class Sampler:
    """Samples `workers` (pids; their backends named `app_prefix` + index) until stopped.
    `groups` name the processes whose CPU is noted (a callable: their pids may change)."""

    def __init__(
        self,
        url: str,
        workers: Sequence[int],
        app_prefix: str,
        database_port: int,
        service_ports: set[int],
        groups: Mapping[str, Callable[[], Sequence[int]]],
    ) -> None:
        self.url = url
        self.workers = list(workers)
        self.app_prefix = app_prefix
        self.sockets = _Sockets(database_port, service_ports)
        self.groups = groups
        self.samples = Samples()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-time sampler")

    def __enter__(self) -> Samples:
        self._thread.start()
        return self.samples

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            count = 0
            while not self._stop.wait(INTERVAL_S):
                self._sample(conn, count % CPU_EVERY == 0)
                count += 1
            self._sample(conn, True)
        self.samples.sampler_cpu_s = time.thread_time()

    def _sample(self, conn: psycopg.Connection[tuple[object, ...]], with_cpu: bool) -> None:
        now = time.time()
        samples = self.samples
        samples.workers.append([worker_state(pid, self.sockets) for pid in self.workers])
        samples.schedstats.append([_schedstat(pid) for pid in self.workers])
        backends: list[set[str]] = [set() for _ in self.workers]
        for name, state, wait_type, wait_event in conn.execute(ACTIVITY, (self.app_prefix + "%",)):
            seen = backend_state(_text(state), _text(wait_type), _text(wait_event))
            index = str(name)[len(self.app_prefix) :]
            if seen and index.isdigit() and int(index) < len(backends):
                backends[int(index)].add(seen)
        samples.backends.append(backends)
        samples.moments.append(now)
        if with_cpu:
            cpu = {
                name: sum(process_cpu_s(p) for p in pids()) for name, pids in self.groups.items()
            }
            cpu["machine"] = _machine_busy_s()
            cpu["pressure"] = _cpu_pressure_s()
            samples.cpu.append((now, cpu))
