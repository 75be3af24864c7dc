"""Every route the edge lets through, by method and path, and who may call it: default-deny.

A request is matched here by its method and path only (never by the shape of its body) to one
`Route`: the normalised request kind it is, who may make it (`Access`), the model its body and
its query must fit (`edge.bodies`) and the most bytes its body may have. A route not listed is a
404 and a method not listed a 405, whatever either engine would have served there; a route
listed as refused is refused for everyone, saying why. Both engines' routes are in one table:
the few only one engine serves answer 404 on the other (the engine's own answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from loopwright.server.edge import bodies as b

# The most bytes of a body, by what the route takes (0: none at all).
SMALL_BODY = 4_096
RUN_BODY = 32_768  # a task of 2,000 characters, a decision, metadata: well inside
DECISION_BODY = 16_384


class Access(StrEnum):
    """Who may make a request of a route (the run rules of `edge.runs` add their own)."""

    PUBLIC = "anyone, without a token"
    TOKEN = "anyone with a token"
    OPERATOR = "operators"
    APPROVER = "approvers"
    READER = "the thread's own user, or an approver of its tenant"
    OWNER = "the thread's own user"
    RUN = "its thread's user, an approver deciding, or the service waking it (edge.runs)"
    REFUSED = "nobody"


@dataclass(frozen=True)
class Route:
    method: str
    template: str  # as the engines' OpenAPI documents write it
    kind: str  # the normalised request kind: what the auth hooks are told was admitted
    access: Access
    body: type[b.Closed] | None = None
    query: type[b.Closed] = b.NoQuery
    max_body: int = 0
    why: str = ""  # a refused route's reason
    status: int = 403  # a refused route's status
    pattern: re.Pattern[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.template)
        object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))


def _refused(method: str, template: str, why: str, status: int = 403) -> Route:
    return Route(method, template, "refused", Access.REFUSED, why=why, status=status)


ASSISTANTS_CLOSED = "the server's assistant is the only one, and read-only"
CLOSED_THREAD = "a thread changes only by running: its state and metadata are the runs'"
NO_CRONS = "scheduled runs are not served: a run starts when its user starts it"
NO_STORE = "the store is not served: a run's memory is its own state"
STATELESS = "a run is a thread: create one first (POST /threads), then start the run on it"
NO_V2 = (
    "protocol v2 is not served: start and resume runs through POST /threads/{thread_id}/runs"
    " (or /runs/wait, /runs/stream)"
)
NO_TRANSPORT = "this transport is not served: use the runs API"

ROUTES: tuple[Route, ...] = (
    # the server's own, and loopwright's
    Route("GET", "/", "server.root", Access.PUBLIC),
    Route("GET", "/ok", "server.ok", Access.PUBLIC, query=b.OkQuery),
    Route("GET", "/live", "server.probe", Access.PUBLIC),
    Route("GET", "/ready", "server.probe", Access.PUBLIC),
    Route("GET", "/health", "server.probe", Access.PUBLIC),
    Route("GET", "/inbox", "inbox.page", Access.PUBLIC),
    Route("GET", "/info", "server.info", Access.TOKEN),
    Route("GET", "/docs", "server.docs", Access.TOKEN),
    Route("GET", "/redoc", "server.docs", Access.TOKEN),
    Route("GET", "/openapi.json", "server.docs", Access.TOKEN),
    Route("GET", "/metrics", "server.metrics", Access.OPERATOR, query=b.MetricsQuery),
    Route("GET", "/loopwright/metrics", "server.metrics", Access.OPERATOR),
    Route("GET", "/inbox/api/approvals", "inbox.list", Access.APPROVER),
    Route(
        "POST",
        "/inbox/api/decisions",
        "inbox.decide",
        Access.APPROVER,
        body=b.DecisionRequest,
        max_body=DECISION_BODY,
    ),
    Route("GET", "/inbox/api/runs/{run_id}/timeline", "inbox.timeline", Access.APPROVER),
    # assistants: read only
    Route(
        "POST",
        "/assistants/search",
        "assistants.read",
        Access.TOKEN,
        body=b.AssistantSearch,
        max_body=SMALL_BODY,
    ),
    Route(
        "POST",
        "/assistants/count",
        "assistants.read",
        Access.TOKEN,
        body=b.AssistantCount,
        max_body=SMALL_BODY,
    ),
    Route("GET", "/assistants", "assistants.read", Access.TOKEN),
    Route("GET", "/assistants/{assistant_id}", "assistants.read", Access.TOKEN),
    Route(
        "GET",
        "/assistants/{assistant_id}/graph",
        "assistants.read",
        Access.TOKEN,
        query=b.GraphQuery,
    ),
    Route(
        "GET",
        "/assistants/{assistant_id}/subgraphs",
        "assistants.read",
        Access.TOKEN,
        query=b.SubgraphsQuery,
    ),
    Route(
        "GET",
        "/assistants/{assistant_id}/subgraphs/{namespace}",
        "assistants.read",
        Access.TOKEN,
        query=b.SubgraphsQuery,
    ),
    Route("GET", "/assistants/{assistant_id}/schemas", "assistants.read", Access.TOKEN),
    Route(
        "POST",
        "/assistants/{assistant_id}/versions",
        "assistants.read",
        Access.TOKEN,
        body=b.VersionsSearch,
        max_body=SMALL_BODY,
    ),
    _refused("POST", "/assistants", ASSISTANTS_CLOSED),
    _refused("PATCH", "/assistants/{assistant_id}", ASSISTANTS_CLOSED),
    _refused("DELETE", "/assistants/{assistant_id}", ASSISTANTS_CLOSED),
    _refused("POST", "/assistants/{assistant_id}/latest", ASSISTANTS_CLOSED),
    # threads
    Route(
        "POST", "/threads", "threads.create", Access.TOKEN, body=b.ThreadCreate, max_body=SMALL_BODY
    ),
    Route(
        "POST",
        "/threads/search",
        "threads.search",
        Access.TOKEN,
        body=b.ThreadSearch,
        max_body=SMALL_BODY,
    ),
    Route(
        "POST",
        "/threads/count",
        "threads.search",
        Access.TOKEN,
        body=b.ThreadCount,
        max_body=SMALL_BODY,
    ),
    Route("GET", "/threads/{thread_id}", "threads.read", Access.READER),
    Route("GET", "/threads/{thread_id}/state", "threads.read", Access.READER, query=b.StateQuery),
    Route(
        "GET",
        "/threads/{thread_id}/state/{checkpoint_id}",
        "threads.read",
        Access.READER,
        query=b.StateQuery,
    ),
    Route(
        "POST",
        "/threads/{thread_id}/state/checkpoint",
        "threads.read",
        Access.READER,
        body=b.StateAt,
        max_body=SMALL_BODY,
    ),
    Route(
        "GET", "/threads/{thread_id}/history", "threads.read", Access.READER, query=b.HistoryQuery
    ),
    Route(
        "POST",
        "/threads/{thread_id}/history",
        "threads.read",
        Access.READER,
        body=b.HistorySearch,
        max_body=SMALL_BODY,
    ),
    Route(
        "GET",
        "/threads/{thread_id}/stream",
        "threads.read",
        Access.READER,
        query=b.ThreadStreamQuery,
    ),
    Route("DELETE", "/threads/{thread_id}", "threads.delete", Access.OWNER),
    _refused("GET", "/threads", "search threads with POST /threads/search"),
    _refused("PATCH", "/threads/{thread_id}", CLOSED_THREAD),
    _refused("POST", "/threads/{thread_id}/state", CLOSED_THREAD),
    _refused("PATCH", "/threads/{thread_id}/state", CLOSED_THREAD),
    _refused("POST", "/threads/{thread_id}/copy", "threads are not copied: a run lives on one"),
    _refused("POST", "/threads/prune", "threads are deleted one by one, by their own user"),
    _refused("GET", "/threads/{thread_id}/storage", "a thread's storage is not served"),
    _refused("POST", "/threads/{thread_id}/commands", NO_V2),
    _refused("POST", "/threads/{thread_id}/stream/events", NO_V2),
    # runs on a thread
    *(
        Route(
            "POST",
            f"/threads/{{thread_id}}/{path}",
            "runs.create",
            Access.RUN,
            body=b.RunCreate,
            max_body=RUN_BODY,
        )
        for path in ("runs", "runs/wait", "runs/stream")
    ),
    Route("GET", "/threads/{thread_id}/runs", "runs.read", Access.READER, query=b.RunsQuery),
    Route("GET", "/threads/{thread_id}/runs/{run_id}", "runs.read", Access.READER),
    Route(
        "GET",
        "/threads/{thread_id}/runs/{run_id}/join",
        "runs.read",
        Access.READER,
        query=b.JoinQuery,
    ),
    Route(
        "GET",
        "/threads/{thread_id}/runs/{run_id}/stream",
        "runs.read",
        Access.READER,
        query=b.RunStreamQuery,
    ),
    Route(
        "POST",
        "/threads/{thread_id}/runs/{run_id}/cancel",
        "runs.cancel",
        Access.OWNER,
        query=b.CancelQuery,
    ),
    _refused("DELETE", "/threads/{thread_id}/runs/{run_id}", "a run's record is not deleted"),
    _refused("PATCH", "/threads/{thread_id}/runs/{run_id}", "cancel a run with POST .../cancel"),
    _refused("POST", "/threads/{thread_id}/runs/crons", NO_CRONS),
    # stateless runs, crons, the store, other transports
    *(_refused("POST", f"/runs{p}", STATELESS, 422) for p in ("", "/wait", "/stream", "/batch")),
    _refused("POST", "/runs/cancel", "cancel runs one by one, by their thread and run id"),
    *(
        _refused(method, template, NO_CRONS)
        for method, template in (
            ("POST", "/runs/crons"),
            ("POST", "/runs/crons/search"),
            ("POST", "/runs/crons/count"),
            ("GET", "/runs/crons/{cron_id}"),
            ("PATCH", "/runs/crons/{cron_id}"),
            ("DELETE", "/runs/crons/{cron_id}"),
        )
    ),
    *(
        _refused(method, template, NO_STORE)
        for method, template in (
            ("PUT", "/store/items"),
            ("GET", "/store/items"),
            ("DELETE", "/store/items"),
            ("POST", "/store/items/search"),
            ("POST", "/store/namespaces"),
        )
    ),
    _refused("POST", "/a2a/{assistant_id}", NO_TRANSPORT),
    *(_refused(m, p, NO_TRANSPORT) for m in ("GET", "POST", "DELETE") for p in ("/mcp", "/mcp/")),
    _refused("POST", "/ui/{graph_id}", NO_TRANSPORT),
)

# A path parameter the engines' routes take: an id (a UUID, a run id), a name (a graph's).
PATH_VALUE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(frozen=True)
class Matched:
    route: Route
    params: dict[str, str]


class NotRouted(Exception):
    """No route takes this request: 404 (no such path) or 405 (not this method)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def match(method: str, path: str) -> Matched:
    """The route a request is, by its method and path; NotRouted otherwise."""
    methods: list[str] = []
    for route in ROUTES:
        found = route.pattern.match(path)
        if found is None:
            continue
        if route.method != method:
            methods.append(route.method)
            continue
        params = found.groupdict()
        if bad := [name for name, value in params.items() if not PATH_VALUE.match(value)]:
            raise NotRouted(404, f"no such {bad[0].removesuffix('_id')}: {path}")
        return Matched(route, params)
    if methods:
        raise NotRouted(405, f"{method} is not served on {path}: {', '.join(sorted(methods))}")
    raise NotRouted(404, f"no route {path}")
