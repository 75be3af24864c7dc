"""What each engine's process (`server.dev`, `server.aegra`) checks as it starts, before it
serves: a setting no run could use stops it there, in one line, not at its first run."""

from __future__ import annotations

from loopwright.server.resources import ServerMisconfigured, check_settings, hosted_agent


def refuse_unusable_settings() -> None:
    """Exit in one line where the hosted agent, or a setting its runs read
    (`resources.check_settings`: the model, the lease, the per-principal bound, tracing),
    cannot be used."""
    try:
        check_settings(hosted_agent())
    except ServerMisconfigured as exc:
        raise SystemExit(str(exc)) from None
