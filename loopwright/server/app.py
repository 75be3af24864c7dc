"""loopwright's own HTTP routes on the server (langgraph.json `http.app`): the approval inbox,
and an operator's probes and metrics (`server.operating`: `/live`, `/ready`, `/health`,
`/loopwright/metrics`).

`GET /inbox` is a small page (plain HTML and script, no assets from elsewhere) that asks for a
bearer token and lists the approvals waiting across threads, each with what a person decides
from: who the customer is and what they asked (the run's task), the action in words and its
arguments, the facts the agent declares for it (drawn from the run's evidence), the reads the
run rests on, how long the request stays valid, and the run's timeline on request. It approves
(with a second click where the write's `confirm` asks for one), rejects (with a reason) or
edits one (the arguments the write lets an approver change). Its data comes from JSON routes,
which authenticate as the server does (`server.identities`: a JWT or the token table) and then
talk to the server's own API with the caller's token, so every rule of the auth hooks applies
to them too:

* `GET /inbox/api/approvals`: pending approvals (the request as the run asked it, and the
  seconds until it expires), for approvers only (a role the agent's `Roles.decide` names),
  without the runs they started themselves;
* `POST /inbox/api/decisions`: `{"thread_id", "interrupt_id", "decision": "approve"|"reject"|
  "edit", "comment", "changes", "confirmed"}` resumes the run with an `ApprovalDecision`
  through the server (a new server run with `Command(resume={interrupt_id: decision})`,
  multitask strategy "reject"), waits for it, and answers what the run then did
  (`server.decision_outcome`). A rejection needs a reason (`comment`); approving a request
  that asks for a confirmation needs `confirmed: true`; an approver who edited an action
  cannot approve it. An edit's `changes` name the arguments it replaces (e.g. `{"amount":
  "40.00"}`); the edited action then waits for an approval of its own. A refused decision is a
  4xx with one line, and the request still waits;
* `GET /inbox/api/runs/{run_id}/timeline`: the run's timeline as `loopwright show` prints it,
  for a run the caller may read.

The page itself carries no data, so it needs no token; the JSON routes do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from fastapi import FastAPI
from langgraph_sdk.client import LangGraphClient
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from loopwright.core.state import ApprovalRequest
from loopwright.decisions import (
    Asked,
    DecisionNotTaken,
    DecisionRefused,
    check_taken,
    prepare,
)
from loopwright.display import UNSHOWABLE
from loopwright.runner import Runner, UnknownRun
from loopwright.server.approvals import Waiting, pending_for, waiting_run
from loopwright.server.decision_outcome import decision_result
from loopwright.server.edge import Edge, admitted
from loopwright.server.edge.bodies import DecisionRequest
from loopwright.server.identities import BEARER_REQUIRED
from loopwright.server.launch import GRAPH_ID
from loopwright.server.operating import METRICS_PATH, live, metrics, ready
from loopwright.server.resources import aresources
from loopwright.server.users import User
from loopwright.server.waker import waking

# The graph a decision resumes a run on (what langgraph.json calls it; `loopwright serve`'s).
ASSISTANT_ID = os.environ.get("LOOPWRIGHT_GRAPH_ID", GRAPH_ID)
# Read once (no file I/O per request), with the characters the page spells out rather than
# show (`display.printable`'s: a bidi override in a task would reorder what an approver reads).
PAGE = (
    Path(__file__)
    .with_name("inbox.html")
    .read_text()
    .replace("UNSHOWABLE_PATTERN", json.dumps(UNSHOWABLE.pattern))
)
TIMELINE_WIDTH = 110  # characters per line, as a terminal would show `loopwright show`


def _inline_hashes(page: str, tag: str) -> str:
    """CSP sources that allow exactly the page's own inline `<tag>` blocks, by their hashes."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
    digests = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks)
    return " ".join(f"'sha256-{digest}'" for digest in digests)


# The page runs its own script and style and nothing else, talks to its own origin only, and
# is shown in no frame (a page framing it could overlay a decision an approver did not mean).
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        f"default-src 'none'; script-src {_inline_hashes(PAGE, 'script')};"
        f" style-src {_inline_hashes(PAGE, 'style')}; connect-src 'self';"
        " frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class InboxError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _approver() -> User:
    """The caller, as the edge authenticated them: an approver (the route's access)."""
    passed = admitted()
    if passed is None or passed.user is None:  # not served through the edge: nobody
        raise InboxError(401, BEARER_REQUIRED)
    return passed.user


@contextlib.asynccontextmanager
async def _server(request: Request) -> AsyncIterator[LangGraphClient]:
    """The server's own API, called in process (the app itself, through the edge again) as the
    caller, with their token, so every rule applies: no address is taken from the request (its
    Host header, a proxy's forwarded scheme), and nothing leaves the process."""
    http = httpx.AsyncClient(
        base_url="http://loopwright.internal",
        headers={"Authorization": request.headers.get("authorization", "")},
        transport=httpx.ASGITransport(app=request.app),
        timeout=httpx.Timeout(connect=5, read=300, write=300, pool=5),
    )
    async with http:
        yield LangGraphClient(http)


async def visible_run(user: User, run_id: str) -> Waiting:
    """The run, if `user` (an approver) may see it: a run of their tenant (404 otherwise, as
    for a run that does not exist: another tenant's runs are not even named)."""
    runner = (await aresources()).runner
    record = await asyncio.to_thread(runner.leases.get, run_id)
    if record is None or record.tenant != user.tenant:
        raise InboxError(404, f"no run {run_id}")
    try:
        return await asyncio.to_thread(waiting_run, runner, record)
    except UnknownRun:
        raise InboxError(404, f"no run {run_id}") from None


async def page(_request: Request) -> Response:
    return HTMLResponse(PAGE, headers=PAGE_HEADERS)


async def list_approvals(request: Request) -> Response:
    try:
        user = _approver()
        runner = (await aresources()).runner
        return JSONResponse({"approvals": await asyncio.to_thread(pending_for, runner, user)})
    except InboxError as exc:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)
    except httpx.HTTPStatusError as exc:
        return _upstream(exc)


def _deliberate(req: ApprovalRequest, body: DecisionRequest) -> None:
    """Refuse what one careless click would do: a rejection without a reason (the run's user
    and the model are told it), an approval the write asks to confirm without the confirmation."""
    if body.decision == "reject" and not body.comment.strip():
        raise InboxError(422, "a rejection needs a reason: say why in the comment")
    if body.decision == "approve" and req.confirm and not body.confirmed:
        raise InboxError(422, f"approving '{req.summary}' needs a confirmation (confirmed: true)")


async def decide(request: Request) -> Response:
    try:
        user = _approver()
        # The edge validated it (`edge.bodies.DecisionRequest`); this is that request again.
        body = DecisionRequest.model_validate(await request.json())
        await visible_run(user, body.thread_id)
        runner = (await aresources()).runner
        try:  # the one decision path (`loopwright.decisions`), as the runs API and the CLI
            ready = await asyncio.to_thread(
                prepare,
                runner,
                body.thread_id,
                user.user_id,
                body.decision,
                asked=Asked(approval_id=body.approval_id, interrupt_id=body.interrupt_id),
                comment=body.comment,
                changes=body.changes,
            )
        except DecisionRefused as exc:
            raise InboxError(exc.status, str(exc)) from None
        _deliberate(ready.request, body)
        async with _server(request) as client:
            server_run = await client.runs.create(
                body.thread_id,
                ASSISTANT_ID,
                command={"resume": ready.resume},
                multitask_strategy="reject",
            )
            # What the run made of it, truthfully: a decision it did not take is a 409.
            await client.runs.join(body.thread_id, server_run["run_id"])
        try:
            await asyncio.to_thread(check_taken, runner, body.thread_id, ready.answer)
        except DecisionNotTaken as exc:
            raise InboxError(409, str(exc)) from None
        values = dict(await asyncio.to_thread(runner.state, body.thread_id))
        result = decision_result(values, ready.request, body.decision, runner.tools)
        return JSONResponse(
            {"run_id": result["run_id"], "decision": body.decision, "result": result}
        )
    except InboxError as exc:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)
    except httpx.HTTPStatusError as exc:
        return _upstream(exc)


async def timeline(request: Request) -> Response:
    """The run's timeline, for a run the caller may read (the server decides, by their token)."""
    try:
        user = _approver()
        run_id = request.path_params["run_id"]
        await visible_run(user, run_id)
        res = await aresources()
        try:
            text = await asyncio.to_thread(_timeline_text, res.runner, run_id)
        except UnknownRun as exc:
            raise InboxError(404, str(exc)) from None
        return PlainTextResponse(text, headers={"Cache-Control": "no-store"})
    except InboxError as exc:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)
    except httpx.HTTPStatusError as exc:
        return _upstream(exc)


def _timeline_text(runner: Runner, run_id: str) -> str:
    # rich's rendering: loaded when first asked for
    from loopwright.display import SafeConsole
    from loopwright.timeline import render_run

    out = io.StringIO()
    render_run(runner, run_id, SafeConsole(file=out, width=TIMELINE_WIDTH, color_system=None))
    return out.getvalue()


def _upstream(exc: httpx.HTTPStatusError) -> Response:
    """The server's own answer (401, 403, 404, 409 ...), passed on."""
    try:
        detail = exc.response.json().get("detail", exc.response.text)
    except ValueError:
        detail = exc.response.text
    return JSONResponse({"detail": detail}, status_code=exc.response.status_code)


async def root(request: Request) -> Response:
    """The root answers that the server is up, as both engines' own do, but names neither the
    engine nor its version (Aegra's told anyone both)."""
    return JSONResponse({"ok": True})


# FastAPI (a Starlette app) because Aegra mounts only FastAPI apps; LangGraph's server takes either.
# Its lifespan wakes the runs parked in a reconciliation when due (`server.waker`).
app = FastAPI(
    title="loopwright inbox", docs_url=None, redoc_url=None, openapi_url=None, lifespan=waking
)
app.add_middleware(Edge)  # before every route of the server's, not only these (`server.edge`)
app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
app.add_api_route("/inbox", page, methods=["GET"], include_in_schema=False)
app.add_api_route("/inbox/api/approvals", list_approvals, methods=["GET"])
app.add_api_route("/inbox/api/decisions", decide, methods=["POST"])
app.add_api_route("/inbox/api/runs/{run_id}/timeline", timeline, methods=["GET"])
# An operator's: probes and metrics (`server.operating`).
app.add_api_route("/live", live, methods=["GET"])
app.add_api_route("/ready", ready, methods=["GET"])
app.add_api_route("/health", ready, methods=["GET"])
app.add_api_route(METRICS_PATH, metrics, methods=["GET"])
