"""One Aegra instance serving loopwright, as a child that never outlives its parent.

``python -m loopwright.server.aegra --host H --port P`` is uvicorn serving Aegra's app
(`aegra_api.main:app`, which reads `AEGRA_CONFIG` and the rest of its settings from the
environment `loopwright.server.cluster` gives it) plus the lifeline watch of
`loopwright.processes.exit_with_parent`: once the `loopwright serve` that started it is gone,
the instance gets SIGTERM and hands its runs back (see `cluster`), as an operator's SIGTERM
would.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from collections.abc import Sequence

from loopwright.processes import exit_with_parent
from loopwright.server import identities
from loopwright.server.edge import protocol
from loopwright.server.service_identity import SELF_URL_ENV, self_url
from loopwright.server.starting import refuse_unusable_settings
from loopwright.server.users import IdentityConfigError

AUTH_MODULE = "loopwright.server.auth"
# Longer than a child's default: a graceful stop hands the runs in flight back first.
GRACE_S = 15.0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loopwright.server.aegra")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    # Aegra serves everyone as one anonymous identity if the auth module fails to load: the
    # identities it reads, and the module itself, are checked before it may.
    try:
        identities.configured()
    except IdentityConfigError as exc:
        raise SystemExit(f"identities: {exc}") from None
    try:
        importlib.import_module(AUTH_MODULE)
    except Exception as exc:  # whatever stops it loading stops the instance, in one line
        raise SystemExit(f"{AUTH_MODULE} does not load: {type(exc).__name__}: {exc}") from None
    refuse_unusable_settings()
    # The agent's tool calls are in the journal and the traces; httpx's line for each, rendered
    # by Aegra's structured logger, cost the instance more CPU than the requests themselves.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ[SELF_URL_ENV] = self_url(args.host, args.port)  # for `server.waker`
    exit_with_parent(GRACE_S)
    import uvicorn

    uvicorn.run(
        "aegra_api.main:app",
        host=args.host,
        port=args.port,
        log_level="info",
        http=protocol.PROTOCOL,  # a request's head bounded as it arrives
    )


if __name__ == "__main__":
    main()
