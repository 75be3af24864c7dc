"""A resumed run uses exactly the model it recorded: its spec and its settings (endpoint, API,
timeout, retries, ...), whatever the environment of the process that resumes it says, unless
the operator names a change (`--model-change`), which the run records in V.

Two OpenAI-compatible servers on loopback stand for two endpoints: the run is started against
one, the environment then points at the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwright import open_runner
from loopwright.models.openai_chat import TIMEOUT_ENV
from loopwright.runner import ModelChanged, ModelSettingsChanged
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.openai_server import MODEL, ModelFactory, OpenAIStub
from tests.runtime_fixtures import DEMO_TASK, cli, principal

SPEC = f"openai:{MODEL}"
SMALL_REFUND_TASK = "Check whether order O-43 can be refunded and refund it if so."


@pytest.fixture
def other_endpoint() -> Iterator[OpenAIStub]:
    with OpenAIStub().serving() as stub:
        yield stub


def test_a_resumed_run_keeps_its_endpoint_and_timeout_and_changes_only_when_told(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    other_endpoint: OpenAIStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    openai_model("chat", timeout_s=64)  # the environment the run starts in: the first endpoint
    with connect(services) as deps:
        with open_runner(database_url, refunds, deps=deps, model_spec=SPEC) as starter:
            kept, changed = (starter.start(DEMO_TASK, principal()) for _ in range(2))
        assert kept.waiting_for_approval and changed.waiting_for_approval
        # The operator's environment now names another endpoint and a shorter timeout.
        monkeypatch.setenv("OPENAI_BASE_URL", other_endpoint.url)
        monkeypatch.setenv(TIMEOUT_ENV, "5")
        asked = len(openai_stub.requests())

        with open_runner(database_url, refunds, deps=deps) as approver:  # names no model
            model, spec = approver.model_for(kept.run_id)
            assert (spec, model.settings.base_url, model.settings.timeout_s) == (  # type: ignore[attr-defined]
                SPEC,
                openai_stub.url,
                64.0,
            )
            done = approver.decide(kept.run_id, "approve", "a-1")
        assert done.stop_reason == "completed"
        assert len(openai_stub.requests()) > asked and other_endpoint.requests() == []

        # The same name, another endpoint: refused in one line, naming what differs.
        with (
            open_runner(database_url, refunds, deps=deps, model_spec=SPEC) as same_name,
            pytest.raises(ModelSettingsChanged) as refused,
        ):
            same_name.decide(changed.run_id, "approve", "a-1")
        said = str(refused.value)
        assert "\n" not in said and f"was started with {SPEC} at other settings" in said
        assert f"base_url '{other_endpoint.url}', recorded '{openai_stub.url}'" in said
        assert "timeout_s 5.0, recorded 64.0" in said and "--model-change" in said
        assert other_endpoint.requests() == []

        # Told to change: the run goes on at the new endpoint, and says so in V.
        with open_runner(
            database_url, refunds, deps=deps, model_spec=SPEC, model_change=True
        ) as changer:
            moved = changer.decide(changed.run_id, "approve", "a-1")
            versions = changer.state(changed.run_id)["versions"]
        assert moved.stop_reason == "completed" and other_endpoint.requests()
        assert versions["model_settings"]["base_url"] == other_endpoint.url
        [change] = versions["model_changes"]
        assert change["from"]["settings"]["base_url"] == openai_stub.url
        assert change["to"]["settings"]["timeout_s"] == 5.0 and change["at"]
        # From then on, the new model is the run's own.
        with open_runner(database_url, refunds, deps=deps) as later:
            model, _ = later.model_for(changed.run_id)
        assert model.settings.base_url == other_endpoint.url  # type: ignore[attr-defined]


def test_another_model_name_is_refused_unless_changed(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
) -> None:
    openai_model("chat")
    with connect(services) as deps:
        with open_runner(database_url, refunds, deps=deps, model_spec=SPEC) as starter:
            waiting = starter.start(DEMO_TASK, principal())
        with (
            open_runner(database_url, refunds, deps=deps, model_spec="openai:other") as other,
            pytest.raises(ModelChanged, match="--model-change"),
        ):
            other.decide(waiting.run_id, "approve", "a-1")


def test_resume_with_the_same_name_at_another_endpoint_is_one_line_exit_2(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    other_endpoint: OpenAIStub,
    tmp_path: Path,
) -> None:
    """A run parked while its refund is processing: `resume --model` of its name with the
    environment at another endpoint is refused before anything is asked or sent."""
    openai_model("chat")
    set_fault(services, "processing", delay_s=3600)
    with (
        connect(services) as deps,
        open_runner(database_url, refunds, deps=deps, model_spec=SPEC) as starter,
    ):
        parked = starter.start(SMALL_REFUND_TASK, principal(task=SMALL_REFUND_TASK))
    assert parked.next_attempt_at is not None
    env = {
        **services.to_env(),
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
        "OPENAI_BASE_URL": other_endpoint.url,
    }
    command = ("resume", parked.run_id, "--db", database_url, "--model", SPEC)
    refused = cli(*command, env=env, expect=2)
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"loopwright: error: run {parked.run_id} was started with {SPEC}")
    assert f"base_url '{other_endpoint.url}'" in line and other_endpoint.requests() == []
