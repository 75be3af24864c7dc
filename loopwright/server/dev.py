"""`langgraph dev`, as a child that never outlives the process that started it.

``python -m loopwright.server.dev ARGS`` is ``langgraph dev ARGS`` plus the lifeline watch of
`loopwright.processes.exit_with_parent`: langgraph's own entry point is not ours to change, so
this module takes its place and hands over to it in the same process. Once the parent is gone
(stopped or killed), the server gets SIGTERM, its shutdown runs, and whatever the hosted
agent's dependencies started from it (started by `spawn` too) follows it down.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence

from loopwright.processes import exit_with_parent
from loopwright.server.edge import protocol
from loopwright.server.service_identity import SELF_URL_ENV, self_url
from loopwright.server.starting import refuse_unusable_settings

# Longer than a child's default: a graceful stop lets runs reach their next step boundary.
GRACE_S = 10.0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    refuse_unusable_settings()
    os.environ[SELF_URL_ENV] = self_url(*_listening(args))  # for `server.waker`
    protocol.install()  # a request's head bounded as it arrives
    exit_with_parent(GRACE_S)
    from langgraph_cli.cli import cli

    cli(["dev", *args], prog_name="langgraph")


def _listening(args: Sequence[str]) -> tuple[str, int]:
    """The host and port `langgraph dev ARGS` listens on (its defaults: 127.0.0.1, 2024)."""
    given = dict(itertools.pairwise(args))
    return given.get("--host", "127.0.0.1"), int(given.get("--port", "2024"))


if __name__ == "__main__":
    main()
