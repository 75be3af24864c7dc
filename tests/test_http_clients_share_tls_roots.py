"""Every HTTP client the project makes verifies with its process's TLS roots, loaded once.

httpx loads the certificate roots into a new TLS context for every client, `httpx.get` and a
transport included, even for a plain-HTTP URL: 10-50 ms of CPU each time. A readiness poll, a
check of the payments service per trial, a request per approval decision paid it again; in
the test suite it was two thirds of the fuzz test's CPU. So every client is made with
`verify=` one kept context (`loopwright.tls.context()`; the reference agent's own,
`services.endpoints.tls_context()`) or with a transport that carries one, and langgraph_sdk's
`get_client` / `get_sync_client`, which make their own transport, are not used.

Read from the source, as the import layers are: a new call site that forgets is found here, not
in a profile months later. The outside application under tests/ is a user's package and keeps
its own ways.
"""

from __future__ import annotations

import ast
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx

from loopwright import tls
from tests.runtime_fixtures import REPO

LINKED = ("graph", "nodes", "tools", "checkpoints")
# graph/, nodes/, tools/ and checkpoints/ are linked into loopwright/, which rglob does not follow.
SOURCES = ("loopwright", *LINKED, "refunds", "benchmarks", "tests")
SKIPPED = (REPO / "tests" / "outside_app",)
REQUESTS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}
CLIENTS = {"Client", "AsyncClient"}
TRANSPORTS = {"HTTPTransport", "AsyncHTTPTransport"}
SDK_CLIENTS = {"get_client", "get_sync_client"}


def sources() -> Iterator[Path]:
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            if not any(path.is_relative_to(skipped) for skipped in SKIPPED):
                yield path


def unshared(path: Path) -> Iterator[str]:
    """Each call in `path` that would load the TLS roots again, as "path:line: call"."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        owner = (
            func.value.id
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            else None
        )
        given = {k.arg for k in node.keywords}
        if owner == "httpx" and name in REQUESTS | TRANSPORTS:
            needed: set[str] = {"verify"}
        elif owner == "httpx" and name in CLIENTS:
            needed = {"verify", "transport"}
        elif name in SDK_CLIENTS:
            # Never shares: build the client with `tests.runtime_fixtures.sdk_client`.
            needed = set()
        else:
            continue
        if not needed & given:
            yield f"{path.relative_to(REPO)}:{node.lineno}: {owner + '.' if owner else ''}{name}(...)"


def test_every_http_client_verifies_with_the_roots_its_process_loaded_once() -> None:
    found = [call for path in sources() for call in unshared(path)]
    assert found == [], "calls that load the TLS roots again:\n" + "\n".join(found)


def test_the_kept_context_verifies_as_httpx_s_default_does() -> None:
    """Sharing the context changes what it costs, not what it checks."""
    kept = tls.context()
    default = httpx.create_ssl_context()
    assert kept is tls.context()
    assert (kept.verify_mode, kept.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert kept.cert_store_stats() == default.cert_store_stats()
    assert kept.cert_store_stats()["x509_ca"] > 0
