"""The sandbox a program action runs in: Monty, a Python interpreter in Rust, in worker processes.

A program reaches nothing but what the runtime hands it: no files, environment, network or
subprocess (Monty has none of them), a clock frozen at the instant the runtime passes, a random
generator seeded by the runtime, sleeps that return at once, printed text collected here. The
only way out is a call of one of the tools it is offered, and each such call ends a segment:
the program is paused there, its whole state dumped to bytes (`Paused.snapshot`), and the
caller decides what the call returns. `resume` loads those bytes into a fresh session of any
worker of any process and goes on from that call, so a paused program is data the run commits,
not a process that must stay alive.

Each segment runs under the program's limits (time between two calls, heap, recursion depth);
exceeding one ends the program with a typed error, as does a worker that dies: the pool
replaces the worker, this process is unharmed. A snapshot made by another version of the
sandbox is refused before it is loaded (`SandboxChanged`): the format is the sandbox's own.
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import threading
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pydantic_monty as monty

# Printed text a program keeps, in all (the rest is cut, and says so).
MAX_PRINTED_CHARS = 4_000
# What a segment may print before the sandbox refuses more (collected on this side).
PRINT_CAP_BYTES = 64_000


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. `seconds`: sandboxed execution between two tool calls (the
    clock stops while a call is out); `memory_bytes`: the heap; `recursion`: the call depth;
    `snapshot_bytes`: the paused program's size, which the run stores at every call."""

    seconds: float = 2.0
    memory_bytes: int = 32_000_000
    recursion: int = 200
    snapshot_bytes: int = 512_000

    def __post_init__(self) -> None:
        for name in ("seconds", "memory_bytes", "recursion", "snapshot_bytes"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, not {value!r}")


class SandboxChanged(Exception):
    """A paused program was dumped by another version of the sandbox than this process has."""


@dataclass(frozen=True)
class Paused:
    """The program called `tool` with `args` and waits for its answer. `snapshot` is the paused
    program (base64 text), `printed` what it printed in the segment that led here."""

    tool: str
    args: dict[str, Any]
    snapshot: str
    printed: str


@dataclass(frozen=True)
class Finished:
    """The program ended: it returned `value` (its last expression, as JSON data)."""

    value: Any
    printed: str


@dataclass(frozen=True)
class Failed:
    """The program ended without a value: it raised, broke a limit, or could not run. `code`:
    `program_raised`, `program_invalid`, `time_limit`, `memory_limit`, `recursion_limit`,
    `suspension_limit`, `too_large`, `sandbox_crashed`, `snapshot_unreadable`."""

    code: str
    detail: str
    printed: str = ""


Step = Paused | Finished | Failed
# What a paused call returns to the program: a value, or an exception raised at the call (an
# exception type Monty knows by name, and its message).
Answer = tuple[str, Any]


def returns(value: Any) -> Answer:
    return ("return", value)


def raises(exc_type: str, message: str) -> Answer:
    return ("raise", (exc_type, message))


_POOL_LOCK = threading.Lock()


def sandbox_version() -> str:
    """The sandbox this process runs programs in: a paused program resumes only in the same."""
    return f"monty {monty.__version__}"


@functools.cache
def _pool() -> monty.Monty:
    """The process's pool of sandbox workers, started on first use and closed at exit. A worker
    that dies (a limit its own watchdog enforces, a crash) is replaced by the pool."""
    with _POOL_LOCK:
        pool = monty.Monty(min_processes=1, request_timeout=30.0)
        pool.__enter__()
        atexit.register(pool.__exit__, None, None, None)
        return pool


_LIMIT_CODES = {
    "TimeoutError": "time_limit",
    "MemoryError": "memory_limit",
    "RecursionError": "recursion_limit",
}


def _failure(exc: monty.MontyError, printed: str) -> Failed:
    if isinstance(exc, monty.MontySyntaxError | monty.MontyTypingError):
        return Failed("program_invalid", str(exc)[:2_000], printed)
    if isinstance(exc, monty.MontyCrashedError):
        what = "timed out" if exc.timed_out else "died"
        return Failed("sandbox_crashed", f"the sandbox worker {what}: {exc}"[:2_000], printed)
    if isinstance(exc, monty.MontyRuntimeError):
        inner = type(exc.exception()).__name__
        detail = exc.display("type-msg")[:2_000]
        if inner == "RuntimeError" and "suspension limit" in detail:
            # Round trips to this side (names it reads, OS calls it tries) have a bound too.
            return Failed("suspension_limit", detail, printed)
        return Failed(_LIMIT_CODES.get(inner, "program_raised"), detail, printed)
    return Failed("sandbox_crashed", f"{type(exc).__name__}: {exc}"[:2_000], printed)


def _printed(collector: monty.CollectString) -> str:
    text = collector.output
    if len(text) > MAX_PRINTED_CHARS:
        return text[:MAX_PRINTED_CHARS] + f"\n[... {len(text) - MAX_PRINTED_CHARS} more characters]"
    return text


def _json_value(value: Any) -> Any:
    """`value` as JSON data, or TypeError: what crosses the sandbox's edge is plain data."""
    return json.loads(json.dumps(value, allow_nan=False))


def _segment(
    snapshot: monty.SyncSnapshot,
    tools: Collection[str],
    limits: SandboxLimits,
    collector: monty.CollectString,
) -> Step:
    """Answer what is not a tool call (a name it reads, an OS call, a call of a name that is no
    tool) as the sandbox's own refusal, until the program calls a tool or ends."""
    while True:
        if isinstance(snapshot, monty.MontyComplete):
            try:
                return Finished(_json_value(snapshot.output), _printed(collector))
            except (TypeError, ValueError) as exc:
                return Failed("program_raised", f"its result is not JSON data: {exc}")
        if isinstance(snapshot, monty.NameLookupSnapshot):
            snapshot = snapshot.resume()  # an undefined name: NameError in the program
            continue
        if isinstance(snapshot, monty.FutureSnapshot):
            return Failed("program_invalid", "a program calls its tools one at a time (no async)")
        if snapshot.is_os_function:
            snapshot = snapshot.resume_not_handled()
            continue
        name = str(snapshot.function_name)
        problem = None
        if name not in tools:
            problem = raises("NameError", f"name {name!r} is not a tool this program may call")
        elif snapshot.args:
            problem = raises("TypeError", f"call {name} with keyword arguments only")
        else:
            try:
                args = _json_value(dict(snapshot.kwargs))
            except (TypeError, ValueError) as exc:
                problem = raises("TypeError", f"arguments of {name} must be JSON data: {exc}")
        if problem is not None:
            snapshot = snapshot.resume(_external(problem))
            continue
        dumped = snapshot.dump()
        if len(dumped) > limits.snapshot_bytes:
            return Failed(
                "too_large",
                f"the paused program is {len(dumped)} bytes, over its {limits.snapshot_bytes}",
                _printed(collector),
            )
        return Paused(name, args, _stored(dumped), _printed(collector))


def _stored(dumped: bytes) -> str:
    """A paused program as the run stores it: compressed (a dump is about half redundancy, and
    the run writes one at every call), as text."""
    return base64.b64encode(zlib.compress(dumped, 1)).decode()


def _external(answer: Answer) -> Any:
    kind, value = answer
    if kind == "return":
        return {"return_value": value}
    exc_type, message = value
    return {"exc_type": exc_type, "message": message}


def start(
    code: str,
    *,
    tools: Collection[str],
    limits: SandboxLimits,
    now: datetime,
    seed: str,
    inputs: dict[str, Any] | None = None,
) -> Step:
    """Run `code` from its start to its first tool call or its end. Its clock reads `now`
    throughout, its random numbers come from `seed`: a program run again from the same point
    makes the same calls."""
    collector = monty.CollectString(max_bytes=PRINT_CAP_BYTES)
    try:
        with _pool().checkout(
            script_name="program.py",
            limits={
                "max_feed_duration_secs": limits.seconds,
                "max_turn_duration_secs": limits.seconds,
                "max_memory": limits.memory_bytes,
                "max_recursion_depth": limits.recursion,
            },
            os_policy={"datetime": now, "sleep": "zero", "random_start": {"seed": seed}},
        ) as session:
            first = session.feed_start(code, inputs=inputs or {}, print_callback=collector)
            return _segment(first, tools, limits, collector)
    except monty.MontyError as exc:
        return _failure(exc, _printed(collector))


def resume(snapshot: str, answer: Answer, *, tools: Collection[str], limits: SandboxLimits) -> Step:
    """Load a paused program (made by `start` or `resume` in any process) into a fresh session
    and go on from its call with `answer`, to its next tool call or its end. A snapshot that
    does not load ends the program `snapshot_unreadable`."""
    collector = monty.CollectString(max_bytes=PRINT_CAP_BYTES)
    try:
        dumped = zlib.decompress(base64.b64decode(snapshot, validate=True))
    except (ValueError, zlib.error) as exc:
        return Failed("snapshot_unreadable", f"the paused program is not readable: {exc}")
    try:
        with _pool().checkout() as session:
            try:
                paused = session.load_snapshot(dumped, print_callback=collector)
            except monty.MontyError as exc:
                return Failed("snapshot_unreadable", f"the sandbox refused it: {exc}"[:2_000])
            if not isinstance(paused, monty.FunctionSnapshot):
                return Failed("snapshot_unreadable", f"it came back as {type(paused).__name__}")
            return _segment(paused.resume(_external(answer)), tools, limits, collector)
    except monty.MontyError as exc:
        return _failure(exc, _printed(collector))


def check_version(recorded: str) -> None:
    """Raise SandboxChanged unless a paused program was made by this sandbox."""
    if recorded != (current := sandbox_version()):
        raise SandboxChanged(f"the program was paused under {recorded}; this process has {current}")
