"""Who a thread belongs to, whichever engine serves it (LangGraph's server or Aegra).

loopwright's auth hooks decide per thread: a customer acts on their own threads only, an
approver on their tenant's. The two engines enforce the hooks' answers differently:

* LangGraph's server applies the filter a hook returns (`{"user": ..., "tenant": ...}`) to
  every operation, so a thread that is not the caller's is simply not found;
* Aegra scopes every row to the authenticated `identity` (its `user_id` column) and applies a
  hook's filter on some routes only (thread reads and searches), discarding it on the others
  (state, history, a thread's runs, joins, streams, cancels).

So the engine's identity is the tenant (`engine_identity`): the engine walls tenants off from
one another in its own queries, and an approver reaches every thread of their tenant, as the
inbox and the SDK's state read need. Within a tenant, the hooks do not rely on filters: they
raise for a thread that is not the caller's, and so need to know whose it is
(`server.edge.threads.thread_owner`): the run's user and tenant in lw_runs once a run is registered
there, else those loopwright stamped into the thread's metadata at its creation, read from the
engine's own thread row (Aegra's `thread` table; LangGraph's in-memory registry has none, and needs none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from loopwright.checkpoints.sql import Database

# The thread metadata keys loopwright stamps (and filters by): Aegra overwrites "owner" with
# the engine identity, so the run's user has a key of its own.
USER_KEY = "user"
TENANT_KEY = "tenant"
# Aegra's thread table (aegra_api.core.orm.Thread): thread_id, user_id, metadata_json.
_AEGRA_THREADS = "thread"


def engine_identity(tenant: str) -> str:
    """The identity the engine scopes its rows to: the tenant, shared by its users."""
    return f"tenant:{tenant}"


class EngineThreads:
    """The engine's own record of threads, where it keeps one in the database (Aegra)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._kept: bool | None = None

    @property
    def kept(self) -> bool:
        """Whether the engine keeps its threads in this database (read once: a table is
        created by the engine's migrations before it serves)."""
        if self._kept is None:
            row = self.db.one(
                "SELECT to_regclass(%s) IS NOT NULL AS kept", (f"public.{_AEGRA_THREADS}",)
            )
            self._kept = bool(row and row["kept"])
        return self._kept

    def owner(self, thread_id: str) -> tuple[bool, str | None, str | None]:
        """Whether the engine has the thread, and the user and tenant loopwright stamped on it
        (None where the engine keeps no threads here, or the thread carries no stamp)."""
        if not self.kept:
            return False, None, None
        row = self.db.one(
            f"SELECT metadata_json->>'{USER_KEY}' AS user_id,"
            f" metadata_json->>'{TENANT_KEY}' AS tenant"
            f" FROM {_AEGRA_THREADS} WHERE thread_id = %s",
            (thread_id,),
        )
        if row is None:
            return False, None, None
        return True, row["user_id"], row["tenant"]


# The engines' thread TTL settings: each has its engine delete or compact expired threads
# (their checkpoints included) with its own checkpointer, outside loopwright's fenced saver.
TTL_ENV = ("AEGRA_THREAD_TTL", "LANGGRAPH_THREAD_TTL")
# Where each engine reads its checkpointer's settings (a `ttl` there does the same): Aegra's
# config file, and the JSON `langgraph dev` passes its server from langgraph.json.
AEGRA_CONFIG_ENV = "AEGRA_CONFIG"
LANGGRAPH_CHECKPOINTER_ENV = "LANGGRAPH_CHECKPOINTER"


class EngineMisconfigured(RuntimeError):
    """The engine is set to change runs' records on its own; the message names the setting."""


def refuse_thread_ttl(environ: Mapping[str, str]) -> None:
    """EngineMisconfigured if the engine would sweep threads by a timer: a journaled run's
    checkpoints deleted (its record and timeline gone), or compacted to the last one, and a run
    waiting for an approval gone from the inbox while lw_runs says it waits."""
    settings = [name for name in TTL_ENV if environ.get(name, "").strip()]
    for name, read in ((AEGRA_CONFIG_ENV, _config_file), (LANGGRAPH_CHECKPOINTER_ENV, json.loads)):
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            config = read(raw)
        except (OSError, ValueError):
            continue  # the engine says what is wrong with its own settings
        checkpointer = config.get("checkpointer", config) if isinstance(config, dict) else {}
        if isinstance(checkpointer, dict) and checkpointer.get("ttl"):
            settings.append(f"{name}'s checkpointer.ttl")
    if settings:
        raise EngineMisconfigured(
            f"{', '.join(settings)}: the engine would delete or compact threads by a timer, a"
            " run's record with them; loopwright keeps runs until its own retention job"
            " (`loopwright retention`) prunes them: unset it"
        )


def _config_file(path: str) -> object:
    return json.loads(Path(path).read_text())
