"""Named crash points: every crash window of the runtime is a place a test can arm.

In the spirit of DBOS's debug triggers. A test (or a user testing their own tools) arms one point
by name through the environment of the process under test:

    LOOPWRIGHT_CRASH_AT=executor:after_dispatch_record loopwright run ...

and that process exits hard (`os._exit`, no cleanup, no flush, as a kill -9 would) the first time
it reaches the point; `NAME#k` exits the k-th time this process reaches it (the second write a
run sends: `executor:after_send#2`). `LOOPWRIGHT_CRASH_AT` may name several points, comma
separated. A process that armed a point and ends without reaching it (a misspelt name, a `#k` it
never got to) says so on stderr, with the nearest name of a point it passed or of the runtime's,
and exits `UNREACHED_EXIT_CODE` instead of its own code: a crash test whose crash never happened
must not pass.

Points in the runtime (`CrashPoint`, `POINTS`):
  node:<name>:start                     a node begins; with durability="sync" this is also
                                        "after the previous node's checkpoint committed" (every
                                        node but guard, which a new run never reaches)
  executor:after_dispatch_record        DISPATCHED is committed, the request is not sent
  executor:after_send                   the tool's send returned (the business system applied
                                        the write), its answer is neither checked nor recorded;
                                        passed by the executor, so whatever transport the tool
                                        uses
  executor:before_outcome_record        the answer was checked, the outcome is not recorded
  reconcile:after_settle                the business system's answer about an unknown write is
                                        journaled, reconcile's own writes are not saved (the
                                        resumed step finds nothing unresolved in the journal
                                        and must still bring the state's projection up to date)
  checkpoint:commit:before_commit:<node> inside the transaction that commits a node's writes
                                        and the checkpoint after them (`checkpoints.compact`,
                                        `checkpoints.fenced`), every statement executed, the
                                        run's row locked: the
                                        resumed run finds none of the node's commit and runs
                                        the node again
  checkpoint:after_writes:<node>        writes saved alone (an interrupt's, an error's), the
                                        checkpoint that may follow them not (the resumed run
                                        must apply them, not stop)
"""

from __future__ import annotations

import atexit
import difflib
import functools
import os
import sys
from collections import Counter
from enum import StrEnum

ENV_VAR = "LOOPWRIGHT_CRASH_AT"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL
UNREACHED_EXIT_CODE = 78  # sysexits' EX_CONFIG: the test armed a point the process never met

NODE_NAMES = (
    "guard",
    "compile_context",
    "model_step",
    "validate",
    "approval",
    "execute",
    "reconcile",
    "verify",
)


class CrashPoint(StrEnum):
    """The runtime's crash points, by name: `LOOPWRIGHT_CRASH_AT=executor:after_send` is
    `CrashPoint.AFTER_SEND`, its k-th passage `CrashPoint.AFTER_SEND.nth(k)`. The points of a
    node or a node's commit are `CrashPoint.node_start(node)`, `CrashPoint.before_commit(node)`
    and `CrashPoint.after_writes(node)`."""

    AFTER_DISPATCH_RECORD = "executor:after_dispatch_record"
    AFTER_SEND = "executor:after_send"
    BEFORE_OUTCOME_RECORD = "executor:before_outcome_record"
    RECONCILE_AFTER_SETTLE = "reconcile:after_settle"

    def nth(self, k: int) -> str:
        return nth(self.value, k)

    @staticmethod
    def node_start(node: str) -> str:
        return f"node:{node}:start"

    @staticmethod
    def before_commit(node: str) -> str:
        return f"checkpoint:commit:before_commit:{node}"

    @staticmethod
    def after_writes(node: str) -> str:
        return f"checkpoint:after_writes:{node}"


def nth(point: str, k: int) -> str:
    """`point#k`: armed so, a process exits the k-th time it reaches `point` (k >= 1)."""
    if k < 1:
        raise ValueError(f"a crash point is reached for the first time at k=1, not {k}")
    return f"{point}#{k}"


POINTS = (
    *(CrashPoint.node_start(name) for name in NODE_NAMES if name != "guard"),
    *(point.value for point in CrashPoint),
    *(CrashPoint.before_commit(node) for node in ("validate", "execute")),
    CrashPoint.after_writes("approval"),
)


@functools.lru_cache(maxsize=8)
def _parse(value: str) -> dict[str, frozenset[int]]:
    """Armed points and the passages at which each exits (`NAME` is `NAME#1`). Parsed once per
    value: a step passes a dozen points, armed or not. A `#k` that is not a whole number from 1
    is kept under its whole text, so it is never reached and is told at exit."""
    armed: dict[str, set[int]] = {}
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        name, hash_, count = item.rpartition("#")
        if not hash_:
            name, count = item, "1"
        if not count.isdigit() or int(count) < 1:
            name, count = item, "1"
        armed.setdefault(name, set()).add(int(count))
    return {name: frozenset(counts) for name, counts in armed.items()}


# How often this process passed each point: for `NAME#k`, and for the exit notice of points
# armed and never reached.
_passed: Counter[str] = Counter()


def armed() -> dict[str, frozenset[int]]:
    value = os.environ.get(ENV_VAR, "")
    points = _parse(value)
    if points:
        _notice_at_exit()
    return points


@functools.cache
def _notice_at_exit() -> None:
    atexit.register(_exit_if_unreached)


def unreached() -> list[tuple[str, int]]:
    """The armed points this process has not reached: each name and the passage it waits for."""
    return [
        (name, k)
        for name, counts in sorted(armed().items())
        for k in sorted(counts)
        if _passed[name] < k
    ]


def _exit_if_unreached() -> None:
    missed = unreached()
    if not missed:
        return
    for name, k in missed:
        if _passed[name]:
            hint = f" (passed {_passed[name]} of {k} times)"
        else:
            near = difflib.get_close_matches(name, sorted(set(_passed) | set(POINTS)), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
        point = name if k == 1 else f"{name}#{k}"
        sys.stderr.write(f"loopwright: crash point {point} was armed and never reached{hint}\n")
    # The process's other exit handlers still run (spans flushed, logs closed); then it ends
    # with a code a test cannot take for success, whatever its own would have been.
    atexit.unregister(_exit_if_unreached)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(UNREACHED_EXIT_CODE)


def crash_point(name: str) -> None:
    """Exit the process at once if `name` is armed (`NAME`, or `NAME#k` for its k-th passage
    in this process). Costs an environment lookup and a counter increment otherwise."""
    _passed[name] += 1
    counts = armed().get(name)
    if counts is not None and _passed[name] in counts:
        sys.stderr.write(f"loopwright: crash point {name} reached, exiting hard\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
