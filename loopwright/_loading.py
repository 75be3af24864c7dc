"""Finding an agent by import path: how every entry point (CLI, worker, server) is told what to
host. `module:attribute` names the `Agent` (or a function returning one); `module` alone means
its `agent` attribute. The current directory is importable, as with `python -m` and uvicorn, so
an application's own package works from its directory without being installed.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from loopwright._agent import Agent


class AgentNotFound(LookupError):
    """The import path names no agent; the message says what was found instead."""


def load_agent(path: str) -> Agent[Any]:
    """The agent at `path` ("module:attribute", or "module" for its `agent` attribute)."""
    module_name, _, attribute = path.strip().partition(":")
    if not module_name:
        raise AgentNotFound(f"{path!r} is not an import path like mypackage.agents:agent")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise AgentNotFound(
                f"no module {module_name!r}: install the application, or run from its directory"
            ) from None
        raise
    value = getattr(module, attribute or "agent", None)
    if value is not None and not isinstance(value, Agent) and callable(value):
        value = value()
    if not isinstance(value, Agent):
        found = type(value).__name__ if value is not None else "nothing"
        raise AgentNotFound(f"{path!r} is {found}, not a loopwright Agent")
    return value
