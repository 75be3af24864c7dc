"""The approval inbox in a real browser: Debian's headless Chromium, driven by Playwright.

An approver opens /inbox, enters their token, sees the pending refund (summary, amount, digest,
expiry), clicks Approve, and the run completes through the server; or edits the amount first,
then approves the edited refund when the run asks for it. Skipped where the machine
has no Chromium (`.ci/run` installs it) or Playwright is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from loopwright.checkpoints.scratch import fresh_database
from loopwright.server.launch import server_env, start_server
from loopwright_refunds.services.admin import create_order, list_refunds
from loopwright_refunds.services.launcher import start_services
from tests.ports import reserved_port
from tests.test_server_langgraph import GRAPH, TASK_O42, TOKENS, values_of

CHROMIUM = os.environ.get("LOOPWRIGHT_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None,
        reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; .ci/run does)",
    ),
]


@pytest.fixture(scope="module")
def inbox_server(
    postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    with fresh_database(postgres_server_url, prefix="lw_test") as url:
        workdir = tmp_path_factory.mktemp("inbox")
        with start_services(workdir / "services") as services:
            env = server_env(
                {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                {
                    "DATABASE_URL": url,
                    "LOOPWRIGHT_TOKENS": json.dumps(TOKENS),
                    **services.endpoints.to_env(),
                },
            )
            with reserved_port() as port, start_server(workdir, env, port=port) as server:
                yield server.url, services.endpoints


def waiting_thread(url: str, task: str) -> tuple[str, dict[str, Any]]:
    """A run of u-1's, started through the server and waiting for approval: (thread, request)."""
    ada = get_sync_client(url=url, headers={"Authorization": "Bearer t-u1"})
    thread = ada.threads.create()
    ada.runs.wait(thread["thread_id"], GRAPH, input={"task": task})
    return thread["thread_id"], ada.threads.get_state(thread["thread_id"])["interrupts"][0]["value"]


def final_values(url: str, thread_id: str) -> dict[str, Any]:
    ada = get_sync_client(url=url, headers={"Authorization": "Bearer t-u1"})
    deadline = time.monotonic() + 60
    while (values := values_of(ada, thread_id)).get("stop_reason") is None:
        assert time.monotonic() < deadline, values
        time.sleep(0.2)
    return values


@contextmanager
def inbox_page(url: str, token: str = "t-a1") -> Iterator[tuple[Any, Any]]:
    """The inbox in headless Chromium, logged in with an approver's token (a-1's by default):
    (playwright's sync API, page)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # Playwright's assertions give up after 5 s by default: too little for Chromium, the server
    # and the run on a loaded machine. They return as soon as they hold.
    sync_api.expect.set_options(timeout=30_000)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{url}/inbox")
            page.get_by_label("Approver token").fill(token)
            page.get_by_role("button", name="Show approvals").click()
            yield sync_api, page
        finally:
            browser.close()


def test_an_approver_approves_in_the_inbox_and_the_run_completes(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, services = inbox_server
    thread_id, request = waiting_thread(url, TASK_O42)
    with inbox_page(url) as (sync_api, page):
        row = page.locator(f'tr[data-approval="{request["approval_id"]}"]')
        sync_api.expect(row).to_contain_text("Refund 100.00 USD to order O-42")
        sync_api.expect(row).to_contain_text("100.00 USD")
        sync_api.expect(row).to_contain_text(request["digest"][:16])
        sync_api.expect(row).to_contain_text(request["expires_at"][:16])
        page.screenshot(path=str(tmp_path / "inbox.png"))
        row.get_by_role("button", name=f"Approve {request['approval_id']}").click()
        sync_api.expect(page.get_by_role("status")).to_contain_text(
            f"Approved {request['approval_id']}"
        )
        sync_api.expect(row).to_have_count(0)

    values = final_values(url, thread_id)
    assert values["stop_reason"] == "completed" and values["verification"]["verified"]
    assert [a["approver"] for a in values["approvals"]] == ["a-1"]
    assert len(list_refunds(services, "O-42")) == 1


def test_an_approver_edits_the_amount_in_the_inbox_then_approves_the_edit(
    inbox_server: tuple[str, Any],
) -> None:
    url, services = inbox_server
    create_order(services, "O-803", "u-1", "80.00")
    thread_id, request = waiting_thread(
        url, "Check whether order O-803 can be refunded and refund it if so."
    )
    with inbox_page(url) as (sync_api, page):
        row = page.locator(f'tr[data-approval="{request["approval_id"]}"]')
        sync_api.expect(row).to_contain_text("Refund 80.00 USD to order O-803")
        row.get_by_label(f"New amount for {request['approval_id']}").fill("40.00")
        row.get_by_role("button", name=f"Edit {request['approval_id']}").click()
        sync_api.expect(page.get_by_role("status")).to_contain_text(
            f"Edited {request['approval_id']}"
        )
        # The edited refund is listed once the run has asked for its approval.
        edited = page.locator(f'tr[data-run="{request["run_id"]}"]')
        sync_api.expect(edited).to_contain_text(
            "Refund 40.00 USD to order O-803 (edited by a-1)", timeout=20_000
        )
        edited.get_by_role("button", name="Approve").click()
        sync_api.expect(edited).to_have_count(0)

    values = final_values(url, thread_id)
    assert values["stop_reason"] == "completed"
    assert [r["amount"] for r in list_refunds(services, "O-803")] == ["40.00"]
