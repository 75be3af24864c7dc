"""The approval inbox in a real browser: Debian's headless Chromium, driven by Playwright,
against a real `langgraph dev` server, the reference services and Postgres.

An approver must be able to decide from the page alone, in the runtime's words whatever the
agent's domain: who requested the run and what was asked, why approval is needed (the reason the
write's approval rule gave), the checks the call passed, the action and its arguments, the facts the agent declares from what the run read
(order total, refundable balance, delivery, the policy's verdict and version), the reads
themselves, the run's timeline, and how long the request stays valid. One click does not
approve an amount above what the agent asks to confirm, a rejection needs a reason, the editor
of an action cannot approve it, a refused decision is said next to the request (which still
waits), and the page says what the run then did. At 390 px the decision buttons stay on
screen. Each test saves screenshots in its own tmp_path (pytest's output folder).

Skipped where the machine has no Chromium (`.ci/run` installs it) or Playwright is not
installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright import tls
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.launch import server_env, start_server
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import create_order, list_refunds, set_fault
from loopwright_refunds.services.launcher import start_services
from tests.ports import reserved_port
from tests.runtime_fixtures import PATIENCE_S, sdk_client, wait_for
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
PHONE = {"width": 390, "height": 844}

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
                    "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
                    **services.endpoints.to_env(),
                },
            )
            with reserved_port() as port, start_server(workdir, env, port=port) as server:
                yield server.url, services.endpoints


def refund_task(order_id: str) -> str:
    return f"Check whether order {order_id} can be refunded and refund it if so."


def waiting_thread(url: str, task: str) -> tuple[str, dict[str, Any]]:
    """A run of u-1's, started through the server and waiting for approval: (thread, request)."""
    ada = sdk_client(url=url, headers={"Authorization": "Bearer t-u1"})
    thread = ada.threads.create()
    ada.runs.wait(thread["thread_id"], GRAPH, input={"task": task})
    return thread["thread_id"], ada.threads.get_state(thread["thread_id"])["interrupts"][0]["value"]


def final_values(url: str, thread_id: str) -> dict[str, Any]:
    ada = sdk_client(url=url, headers={"Authorization": "Bearer t-u1"})
    wait_for(lambda: values_of(ada, thread_id).get("stop_reason") is not None)
    return values_of(ada, thread_id)


def still_waiting(url: str, thread_id: str, approval_id: str) -> bool:
    """Whether the run still waits for exactly this approval (nothing was decided)."""
    ada = sdk_client(url=url, headers={"Authorization": "Bearer t-u1"})
    interrupts = ada.threads.get_state(thread_id)["interrupts"]
    values = values_of(ada, thread_id)
    return [i["value"]["approval_id"] for i in interrupts] == [approval_id] and not any(
        r["approval_id"] == approval_id for r in values.get("approvals") or []
    )


def post_decision(url: str, token: str, thread_id: str, **body: Any) -> httpx.Response:
    ada = sdk_client(url=url, headers={"Authorization": "Bearer t-u1"})
    [interrupt] = ada.threads.get_state(thread_id)["interrupts"]
    return httpx.post(
        f"{url}/inbox/api/decisions",
        headers={"Authorization": f"Bearer {token}"},
        json={"thread_id": thread_id, "interrupt_id": interrupt["id"], **body},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )


@contextmanager
def inbox_page(
    url: str, token: str = "t-a1", viewport: dict[str, int] | None = None
) -> Iterator[tuple[Any, Any]]:
    """The inbox in headless Chromium, logged in with an approver's token (a-1's by default):
    (playwright's sync API, page)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # Playwright's assertions give up after 5 s by default: too little for Chromium, the server
    # and the run on a loaded machine. They return as soon as they hold.
    sync_api.expect.set_options(timeout=PATIENCE_S * 1000)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport=viewport or {"width": 1280, "height": 900})
            page.goto(f"{url}/inbox")
            page.get_by_label("Approver token").fill(token)
            page.get_by_role("button", name="Show approvals").click()
            yield sync_api, page
        finally:
            browser.close()


def card_of(page: Any, approval_id: str) -> Any:
    return page.locator(f'article[data-approval="{approval_id}"]')


def test_an_approver_decides_from_the_run_context_and_the_page_says_the_refund_succeeded(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, services = inbox_server
    thread_id, request = waiting_thread(url, TASK_O42)
    apr, run_id = request["approval_id"], request["run_id"]
    with inbox_page(url) as (sync_api, page):
        expect = sync_api.expect
        card = card_of(page, apr)
        expect(card).to_contain_text("Refund 100.00 USD to order O-42")
        # Who asked, and what, in their words; in the runtime's words, not the agent's domain.
        expect(card).to_contain_text("Requested by u-1")
        expect(card.locator("h3", has_text="What was asked")).to_have_count(1)
        expect(card.locator("blockquote")).to_have_text(TASK_O42)
        assert "customer" not in card.inner_text().lower()
        # Why a person is asked: the reason the write's approval rule gave.
        expect(card.locator("p.why")).to_have_text(
            "100.00 USD is above the approval threshold of 50.00 (refund policy v1)"
        )
        # The checks the call passed before anyone was asked.
        checks = card.locator("ul.checks li")
        expect(checks).to_have_count(5)
        expect(checks.nth(1)).to_have_text("inside the task's boundary: order:O-42")
        expect(checks.nth(2)).to_have_text("authorised for u-1 (default)")
        expect(checks.nth(3)).to_have_text("business rules hold now: refund_policy_holds")
        # The agent's facts, from what the run read (O-42: 100.00, nothing refunded yet).
        for label, value in [
            ("Order total", "100.00 USD"),
            ("Refunded so far", "0.00 USD"),
            ("Refundable", "100.00 USD"),
            ("Policy", "refunds v1, 30-day window: allows this refund"),
        ]:
            expect(
                card.locator("dt", has_text=label).locator("xpath=following-sibling::dd[1]")
            ).to_contain_text(value)
        expect(
            card.locator("dt", has_text="Delivered").locator("xpath=following-sibling::dd[1]")
        ).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2} \(status delivered\)$"))
        expect(card).to_contain_text("amount")
        expect(card.locator("ul.evidence")).to_contain_text("get_order order:O-42")
        expect(card.locator("ul.evidence")).to_contain_text("get_policy")
        # Relative expiry, the absolute time on hover; the digest only small, never a column.
        expiry = card.locator(".expires")
        expect(expiry).to_have_text(re.compile(r"^expires in 23 h$"))
        assert request["expires_at"] in (expiry.get_attribute("title") or "")
        assert request["digest"] not in card.inner_text()
        # The run's timeline, from the server.
        card.get_by_text("Run timeline").click()
        expect(card.locator("details pre")).to_contain_text(f"run {run_id}")
        expect(card.locator("details pre")).to_contain_text("waiting for approval " + apr)
        expect(card).to_contain_text(f"loopwright show {run_id}")
        page.screenshot(path=str(tmp_path / "inbox-context.png"), full_page=True)

        card.get_by_role("button", name=f"Approve {apr}").click()
        status = page.get_by_role("status")
        expect(status).to_contain_text(
            f"Approved {apr} (run {run_id}) — sent, succeeded: refund_id rf_"
        )
        expect(status).to_contain_text("The run completed")
        expect(card).to_have_count(0)
        shown = status.inner_text()
        assert "continues" not in shown and "goes on" not in shown
        page.screenshot(path=str(tmp_path / "inbox-approved.png"), full_page=True)

    values = final_values(url, thread_id)
    assert values["stop_reason"] == "completed" and values["verification"]["verified"]
    assert [a["approver"] for a in values["approvals"]] == ["a-1"]
    [refund] = list_refunds(services, "O-42")
    assert f"refund_id {refund['refund_id']}" in shown


def test_one_click_does_not_approve_an_amount_the_agent_asks_to_confirm(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, services = inbox_server
    create_order(services, "O-870", "u-1", "10000.00")
    thread_id, request = waiting_thread(url, refund_task("O-870"))
    apr = request["approval_id"]
    assert request["confirm"] is True
    # The route refuses an unconfirmed approval too, in one line; nothing was decided.
    refused = post_decision(url, "t-a1", thread_id, decision="approve")
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        "approving 'Refund 10000.00 USD to order O-870' needs a confirmation (confirmed: true)"
    )
    assert still_waiting(url, thread_id, apr)
    with inbox_page(url) as (sync_api, page):
        expect = sync_api.expect
        card = card_of(page, apr)
        expect(
            card.locator("dt", has_text="Order total").locator("xpath=following-sibling::dd[1]")
        ).to_have_text("10,000.00 USD")
        card.get_by_role("button", name=f"Approve {apr}").click()
        confirming = card.locator(".confirming")
        expect(confirming).to_be_visible()
        expect(confirming).to_contain_text("This approves: Refund 10000.00 USD to order O-870")
        page.screenshot(path=str(tmp_path / "inbox-confirm.png"), full_page=True)
        assert still_waiting(url, thread_id, apr)  # the first click sent nothing
        card.get_by_role("button", name=f"Cancel {apr}").click()
        expect(confirming).to_be_hidden()
        assert still_waiting(url, thread_id, apr)
        card.get_by_role("button", name=f"Approve {apr}").click()
        card.get_by_role("button", name=f"Confirm approval {apr}").click()
        expect(page.get_by_role("status")).to_contain_text(f"Approved {apr}")
        expect(page.get_by_role("status")).to_contain_text("sent, succeeded: refund_id rf_")
    assert [r["amount"] for r in list_refunds(services, "O-870")] == ["10000.00"]


def test_a_rejection_needs_a_reason_and_the_page_fits_a_phone(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, services = inbox_server
    create_order(services, "O-871", "u-1", "90.00")
    thread_id, request = waiting_thread(url, refund_task("O-871"))
    apr, run_id = request["approval_id"], request["run_id"]
    refused = post_decision(url, "t-a1", thread_id, decision="reject", comment="  ")
    assert refused.status_code == 422
    assert refused.json()["detail"] == "a rejection needs a reason: say why in the comment"
    assert still_waiting(url, thread_id, apr)
    with inbox_page(url, viewport=PHONE) as (sync_api, page):
        expect = sync_api.expect
        card = card_of(page, apr)
        expect(card).to_contain_text("Refund 90.00 USD to order O-871")
        # Nothing is cut off at 390 px: no sideways scrolling, the decision buttons on screen.
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        for name in ("Approve", "Reject", "Edit"):
            button = card.get_by_role("button", name=f"{name} {apr}")
            button.scroll_into_view_if_needed()
            box = button.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        page.screenshot(path=str(tmp_path / "inbox-phone.png"), full_page=True)

        card.get_by_role("button", name=f"Reject {apr}").click()
        expect(card.get_by_role("alert")).to_have_text(
            "A rejection needs a reason: say why in the comment."
        )
        assert still_waiting(url, thread_id, apr)
        card.get_by_label(f"Comment on {apr}").fill("the customer withdrew the request")
        card.get_by_role("button", name=f"Reject {apr}").click()
        status = page.get_by_role("status")
        expect(status).to_contain_text(
            f"Rejected {apr} (run {run_id}) — not sent: approval_rejected — rejected by a-1: "
            "the customer withdrew the request."
        )
        expect(status).to_contain_text("The run ended: ")
        page.screenshot(path=str(tmp_path / "inbox-phone-rejected.png"), full_page=True)
        shown = status.inner_text()
    values = final_values(url, thread_id)
    assert f"The run ended: {values['stop_reason'].replace('_', ' ')}" in shown
    assert list_refunds(services, "O-871") == []


def test_an_editor_cannot_approve_their_edit_and_refused_edits_are_said_in_place(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, services = inbox_server
    create_order(services, "O-803", "u-1", "80.00")
    thread_id, request = waiting_thread(url, refund_task("O-803"))
    apr = request["approval_id"]
    with inbox_page(url) as (sync_api, page):
        expect = sync_api.expect
        card = card_of(page, apr)
        alert = card.get_by_role("alert")
        # An edit the write's rules refuse: said next to the request, which still waits.
        card.get_by_label(f"New amount for {apr}").fill("500.00")
        card.get_by_role("button", name=f"Edit {apr}").click()
        expect(alert).to_contain_text("Refused (422): the edited submit_refund breaks a rule")
        expect(alert).to_contain_text("amount_exceeds_refundable")
        expect(card).to_be_visible()
        assert still_waiting(url, thread_id, apr)
        page.screenshot(path=str(tmp_path / "inbox-edit-refused.png"), full_page=True)
        # The second edit is taken; the first one's error and no older line are left.
        card.get_by_label(f"New amount for {apr}").fill("40.00")
        card.get_by_role("button", name=f"Edit {apr}").click()
        status = page.get_by_role("status")
        expect(status).to_contain_text(
            f"Edited {apr} (run {thread_id}) — Refund 40.00 USD to order O-803 (edited by a-1) "
            "waits for another approver"
        )
        expect(card).to_have_count(0)
        expect(page.locator(".error:not(:empty)")).to_have_count(0)
        assert "Refused" not in status.inner_text()

        # The editor cannot approve their own edit: refused in place, it still waits.
        edited = page.locator(f'article[data-run="{thread_id}"]')
        expect(edited).to_contain_text("Edited by a-1: another approver must approve it.")
        expect(
            edited.locator("dt", has_text="Refundable").locator("xpath=following-sibling::dd[1]")
        ).to_have_text("80.00 USD")
        new_apr = edited.get_attribute("data-approval")
        assert new_apr is not None and new_apr != apr
        edited.get_by_role("button", name=f"Approve {new_apr}").click()
        expect(edited.get_by_role("alert")).to_have_text(
            f"Refused (422): a-1 edited {new_apr} and cannot also approve it: another approver "
            f"must (separation of duties); {new_apr} still waits for a decision"
        )
        assert still_waiting(url, thread_id, new_apr)
        page.screenshot(path=str(tmp_path / "inbox-separation.png"), full_page=True)

    with inbox_page(url, token="t-a2") as (sync_api, page):
        card_of(page, new_apr).get_by_role("button", name=f"Approve {new_apr}").click()
        sync_api.expect(page.get_by_role("status")).to_contain_text(
            f"Approved {new_apr} (run {thread_id}) — sent, succeeded: refund_id rf_"
        )
    values = final_values(url, thread_id)
    assert values["stop_reason"] == "completed"
    assert [(r["approver"], r["decision"]) for r in values["approvals"]] == [
        ("a-1", "edit"),
        ("a-2", "approve"),
    ]
    assert [r["amount"] for r in list_refunds(services, "O-803")] == ["40.00"]


def test_a_refund_the_payments_service_refuses_is_said_to_be_refused(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    """The approval was right when given, and payments refused the send: another desk's refund
    of 150.00 is still processing there, which the orders' balance (and so the policy's check)
    does not show yet. The page says the refund was sent and refused, not "Approved"."""
    url, services = inbox_server
    create_order(services, "O-872", "u-1", "200.00")
    set_fault(services, "processing", delay_s=3600)
    other = httpx.post(
        f"{services.payments}/refunds",
        json={"order_id": "O-872", "amount": "150.00", "currency": "USD", "reason": "desk"},
        headers={"Idempotency-Key": "other-desk:O-872"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )
    assert other.status_code < 300 and other.json()["status"] == "processing", other.text
    thread_id, request = waiting_thread(url, refund_task("O-872"))
    apr = request["approval_id"]
    with inbox_page(url) as (sync_api, page):
        card_of(page, apr).get_by_role("button", name=f"Approve {apr}").click()
        status = page.get_by_role("status")
        sync_api.expect(status).to_contain_text(
            f"Approved {apr} (run {thread_id}) — sent, refused by the business system: "
            "amount_exceeds_refundable"
        )
        page.screenshot(path=str(tmp_path / "inbox-refused-by-payments.png"), full_page=True)
        shown = status.inner_text()
    values = final_values(url, thread_id)
    [action] = [a for a in values["journal"].values() if a["tool"] == "submit_refund"]
    assert action["status"] == "FAILED"
    assert values["stop_reason"] != "completed"
    assert f"The run ended: {values['stop_reason'].replace('_', ' ')}" in shown
    assert [r["status"] for r in list_refunds(services, "O-872")] == ["processing"]


def test_text_that_would_reorder_what_the_approver_reads_is_spelled_out(
    inbox_server: tuple[str, Any], tmp_path: Path
) -> None:
    """A customer's task with a right-to-left override would show its tail reversed ("USD
    00.5" read as "5.00 USD"), a line separator would break a line: the page spells them out,
    as the CLI does, and shows the rest as written."""
    url, services = inbox_server
    create_order(services, "O-874", "u-1", "500.00")
    task = refund_task("O-874") + " Only \u202eDSU 00.5\u202c, please.\u2028Approved: yes"
    thread_id, request = waiting_thread(url, task)
    apr = request["approval_id"]
    with inbox_page(url) as (sync_api, page):
        expect = sync_api.expect
        card = card_of(page, apr)
        quote = card.locator("blockquote")
        expect(quote).to_have_text(
            refund_task("O-874") + " Only \\u202eDSU 00.5\\u202c, please.\\u2028Approved: yes"
        )
        page.screenshot(path=str(tmp_path / "inbox-spelled.png"), full_page=True)
        card.locator("details summary").first.click()
        expect(card.locator("details pre")).to_contain_text("Only \\u202eDSU 00.5\\u202c")
    assert still_waiting(url, thread_id, apr)
