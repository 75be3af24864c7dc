"""Finding an agent by import path: how every entry point (CLI, worker, server) is told what to
host. `module:attribute` names the `Agent` (or a function returning one); `module` alone means
its `agent` attribute. The current directory is importable, as with `python -m` and uvicorn, so
an application's own package works from its directory without being installed.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
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
    except Exception as exc:  # SyntaxError included
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and (module_name + ".").startswith(missing + "."):
            raise AgentNotFound(
                f"no module {module_name!r}: install the application, or run from its directory"
            ) from None
        # The application's own code failed (or an import of its own did).
        importing = _failed(f"importing {module_name!r}", exc, f"import {module_name}")
        raise AgentNotFound(importing) from exc
    name = attribute or "agent"
    if not hasattr(module, name):
        raise AgentNotFound(f"module {module_name!r} has no {name!r}: {path!r} names no agent")
    value = getattr(module, name)
    if not isinstance(value, Agent) and callable(value):
        try:
            value = value()
        except Exception as exc:
            call = f"from {module_name} import {name}; {name}()"
            raise AgentNotFound(_failed(f"calling {path!r}", exc, call)) from exc
    if not isinstance(value, Agent):
        raise AgentNotFound(f"{path!r} is {type(value).__name__}, not a loopwright Agent")
    return value


def _failed(doing: str, exc: BaseException, reproduce: str) -> str:
    """One line for the application's code failing as it was loaded: the error, where it was
    raised (the deepest frame of the application's, not of Python's import machinery or of
    this module), and the command that shows its traceback."""
    if isinstance(exc, SyntaxError):
        message, where = exc.msg, f" at {exc.filename}:{exc.lineno}" if exc.filename else ""
    else:
        message = " ".join(str(exc).split()) or "(no message)"
        frames = [
            frame
            for frame in traceback.extract_tb(exc.__traceback__)
            if "importlib" not in frame.filename and frame.filename != __file__
        ]
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return (
        f"{doing} failed: {type(exc).__name__}: {message}{where}"
        f" (python -c '{reproduce}' shows the traceback)"
    )
