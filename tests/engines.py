"""A loopwright server on either engine, for tests that hold on both: `langgraph dev` as
`loopwright serve` starts it, or one instance of an Aegra deployment as `loopwright serve
--engine aegra` starts one, each on a database and reference services of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_aegra_scaleout import AEGRA, deployment
from tests.test_server_langgraph import TOKENS, Served, serving

# `@pytest.fixture(params=ENGINES)`: a test on both engines (Aegra's skipped where it cannot run).
ENGINES = ["langgraph", pytest.param("aegra", marks=AEGRA)]


@contextmanager
def served_on(engine: str, postgres_server_url: str, workdir: Path, **env: str) -> Iterator[Served]:
    """A server of `engine` taking the tests' tokens, with `env` added to its environment."""
    if engine == "langgraph":
        with serving(postgres_server_url, workdir, TOKENS, **env) as served:
            yield served
        return
    with deployment(postgres_server_url, workdir) as cluster:
        instance = cluster.start_with("aegra", **env)
        yield Served(instance.url, cluster.database_url, cluster.services)
