"""Where loopwright keeps local files (the embedded database, traces, the servers' and MCP
servers' logs): LOOPWRIGHT_HOME, else ./.loopwright."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "./.loopwright"
HOME_ENV = "LOOPWRIGHT_HOME"


class HomeUnusable(RuntimeError):
    """LOOPWRIGHT_HOME (or ./.loopwright) is not, and cannot become, a directory."""


def loopwright_home(*, create: bool = True) -> Path:
    """Where loopwright keeps local files: LOOPWRIGHT_HOME, else ./.loopwright (created here,
    unless not `create`)."""
    home = Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).resolve()
    if create:
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            named = f"{HOME_ENV}={home}" if os.environ.get(HOME_ENV) else str(home)
            raise HomeUnusable(
                f"{named} cannot be the directory of loopwright's files: {exc.strerror or exc}"
            ) from None
    return home
