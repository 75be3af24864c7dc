"""The TLS roots this process verifies servers with, loaded once.

httpx builds a verifying TLS context for every client it makes, `httpx.get` and a transport
included, even for a plain-HTTP URL, and loading the certificate roots into it takes 10-50 ms
of CPU. A readiness poll every 0.2 s, a request per approval decision, a health check per
probe: each paid that again. Every client loopwright makes passes `verify=context()` instead,
which verifies exactly as httpx's default does (certifi's roots, or SSL_CERT_FILE /
SSL_CERT_DIR when set) with roots loaded once per process. A context is safe to share between
threads, clients and forked children.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def context() -> ssl.SSLContext:
    """httpx's default verifying context, made on first use and kept."""
    return httpx.create_ssl_context()
