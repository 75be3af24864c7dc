"""Database URLs, connection failures, and checkpointers that keep DeltaChannel state."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from loopwright.checkpoints.database import (
    DatabaseKind,
    DatabaseUnavailable,
    DatabaseUrlError,
    database_kind,
    resolve_database_url,
)
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import open_lease_store

CONFIG: RunnableConfig = {"configurable": {"thread_id": "run-1"}}


def test_explicit_url_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@db.example/loopwright")
    assert resolve_database_url("sqlite:///x.sqlite3") == "sqlite:///x.sqlite3"
    assert resolve_database_url() == "postgresql://postgres@db.example/loopwright"


def test_default_is_a_sqlite_file_in_loopwright_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(home))
    url = resolve_database_url()
    assert url == f"sqlite:///{home / 'loopwright.sqlite3'}"
    assert home.is_dir()
    with open_checkpointer(url):
        assert (home / "loopwright.sqlite3").is_file()


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("sqlite:///relative.sqlite3", DatabaseKind.SQLITE),
        ("sqlite:////abs/path.sqlite3", DatabaseKind.SQLITE),
        ("postgresql://u@localhost/db", DatabaseKind.POSTGRES),
        ("postgres://u@localhost:5433/db", DatabaseKind.POSTGRES),
    ],
)
def test_database_kind_from_the_scheme(url: str, kind: DatabaseKind) -> None:
    assert database_kind(url) is kind


@pytest.mark.parametrize(
    "url",
    [
        "mysql://u:hunter2@host/db",
        "",  # --db "$DATABASE_URL" with the variable unset: not the default database
        " ",
        "sqlite://",
        "sqlite:///",
        "/a/path.sqlite3",
        "pg:x",
        # URLs no parser reads: Python's (a bracket left open), libpq's (an unknown parameter,
        # a percent sign that encodes nothing).
        "postgresql://u:hunter2@[::1/db",
        "postgresql://u:hunter2@localhost/db?nonsense=1",
        "postgresql://u:hunter2%zz@localhost/db",
    ],
)
def test_unsupported_and_unreadable_urls_are_refused_in_one_line(url: str) -> None:
    with pytest.raises(DatabaseUrlError) as refused:
        resolve_database_url(url)
    assert "\n" not in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_unreachable_postgres_fails_fast_without_the_password() -> None:
    url = "postgresql://postgres:hunter2@127.0.0.1:1/x?password=hunter2"
    for opener in (open_checkpointer, open_journal, open_lease_store):
        with pytest.raises(DatabaseUnavailable) as refused, opener(url):
            pass
        message = str(refused.value)
        assert message.startswith("database postgresql://postgres@127.0.0.1:1/x is unreachable: ")
        assert "hunter2" not in message and "\n" not in message
        # Fast: the first connection's refusal is the answer, not a pool's wait or a timeout
        # that ran out (judged by what it says, not by a clock: a loaded machine is slow).
        assert "Connection refused" in message, message


def test_an_unopenable_sqlite_file_is_unavailable_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "garbage.sqlite3").write_bytes(b"not a database at all, " * 100)
    for path, why in (
        (tmp_path / "no-such-dir" / "db.sqlite3", f"there is no directory {tmp_path}/no-such-dir"),
        (tmp_path, f"{tmp_path} is a directory, not a database file"),
        (tmp_path / "garbage.sqlite3", "file is not a database"),
    ):
        with (
            pytest.raises(DatabaseUnavailable, match=re.escape(why)),
            open_checkpointer(f"sqlite:///{path}"),
        ):
            pass


def extend_notes(current: list[str], batches: Sequence[list[str]]) -> list[str]:
    return [*current, *(note for batch in batches for note in batch)]


class Notes(TypedDict):
    notes: Annotated[list[str], DeltaChannel(extend_notes)]


def append_note(state: Notes) -> dict[str, Any]:
    return {"notes": [f"note {len(state['notes'])}"]}


def noting_graph(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(Notes)
    builder.add_node("first", append_note)
    builder.add_node("second", append_note)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


def test_delta_channel_state_survives_a_reopen(database_url: str) -> None:
    with open_lease_store(database_url) as leases:
        leases.register("run-1", task="notes", user_id="u-1")
        lease = leases.claim("run-1", "worker-a", ttl_s=30)
    with open_checkpointer(database_url, fence=Fence.of(lease)) as saver:
        graph = noting_graph(saver)
        graph.invoke({"notes": ["task"]}, CONFIG, durability="sync")
        graph.invoke({"notes": ["again"]}, CONFIG, durability="sync")
    with open_checkpointer(database_url) as reopened:
        notes = noting_graph(reopened).get_state(CONFIG).values["notes"]
    assert notes == ["task", "note 1", "note 2", "again", "note 4", "note 5"]
