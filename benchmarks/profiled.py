"""Run a module under cProfile and write the profile as it exits, a SIGTERM included:

    python -m benchmarks.profiled OUT MODULE [ARGS...]

`python -m cProfile` writes nothing for a server stopped by SIGTERM: uvicorn, once it has shut
down, raises the signal again for its default action, which ends the process before the profile
is written. Here that signal ends it by SystemExit instead, and the profile is written on the
way out (`benchmarks.served_cost` profiles an Aegra instance so)."""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    out, module, *args = sys.argv[1:]
    signal.signal(signal.SIGTERM, _exit)
    sys.argv = [module, *args]
    profile = cProfile.Profile()
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
