"""Named crash points: every crash window of the runtime is a place a test can arm.

In the spirit of DBOS's debug triggers. A test (or a user testing their own tools) arms one point
by name through the environment of the process under test:

    LOOPWRIGHT_CRASH_AT=executor:after_dispatch_record loopwright run ...

and that process exits hard (`os._exit`, no cleanup, no flush, as a kill -9 would) the first time
it reaches the point. `LOOPWRIGHT_CRASH_AT` may name several points, comma separated. A
process that armed a point and ends without reaching it says so on stderr as it exits, with
the nearest name of a point it passed or of the runtime's: a misspelt point would otherwise
leave a crash test passing without its crash.

Points in the runtime (`POINTS`):
  node:<name>:start                     a node begins; with durability="sync" this is also
                                        "after the previous node's checkpoint committed" (every
                                        node but guard, which a new run never reaches)
  executor:after_dispatch_record        DISPATCHED is committed, the request is not sent
  executor:after_send                   the business system applied the write, the response
                                        has not been read (armed with a downstream that delays
                                        its answer; see tests)
  executor:before_outcome_record        the response was read, the outcome is not recorded
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

ENV_VAR = "LOOPWRIGHT_CRASH_AT"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL

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
POINTS = (
    *(f"node:{name}:start" for name in NODE_NAMES if name != "guard"),
    "executor:after_dispatch_record",
    "executor:after_send",
    "executor:before_outcome_record",
    "reconcile:after_settle",
    *(f"checkpoint:commit:before_commit:{node}" for node in ("validate", "execute")),
    "checkpoint:after_writes:approval",
)


@functools.lru_cache(maxsize=8)
def _parse(value: str) -> frozenset[str]:
    """Parsed once per value: a step passes a dozen points, armed or not."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


# The points this process passed, for the exit notice of points armed and never reached.
_passed: set[str] = set()


def armed() -> frozenset[str]:
    value = os.environ.get(ENV_VAR, "")
    points = _parse(value)
    if points:
        _notice_at_exit()
    return points


@functools.cache
def _notice_at_exit() -> None:
    atexit.register(_tell_unreached)


def _tell_unreached() -> None:
    for name in sorted(armed() - _passed):
        near = difflib.get_close_matches(name, sorted(_passed | set(POINTS)), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        sys.stderr.write(f"loopwright: crash point {name} was armed and never reached{hint}\n")


def crash_point(name: str) -> None:
    """Exit the process at once if `name` is armed. Costs an environment lookup and a set
    insertion otherwise."""
    _passed.add(name)
    if name in armed():
        sys.stderr.write(f"loopwright: crash point {name} reached, exiting hard\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
