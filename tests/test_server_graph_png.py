"""`loopwright graph --png FILE`: the graph picture rendered offline with Graphviz's dot."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from loopwright.cli.graph_command import graph_dot
from loopwright.graph.build import NODES, compile_graph
from tests.runtime_fixtures import cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_the_dot_source_has_every_node_and_dashed_routes() -> None:
    source = graph_dot(compile_graph().get_graph())
    for node in NODES:
        assert f'"{node}" [label="{node}"]' in source
    assert '"__start__" -> "compile_context";' in source  # a plain edge
    assert '"compile_context" -> "model_step" [style=dashed];' in source  # a routed one


@pytest.mark.skipif(
    shutil.which("dot") is None, reason="no Graphviz dot (apt-get install graphviz)"
)
def test_graph_png_renders_offline(tmp_path: Path) -> None:
    target = tmp_path / "loopwright.png"
    result = cli("graph", "--png", str(target), env={}, expect=0)
    assert f"wrote {target}" in result.stdout
    data = target.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width > 200 and height > 400  # eight nodes, top to bottom


def test_graph_png_without_dot_says_what_to_install(tmp_path: Path) -> None:
    target = tmp_path / "loopwright.png"
    result = cli("graph", "--png", str(target), env={"PATH": str(tmp_path)})
    assert result.returncode == 2
    assert "apt-get install graphviz" in result.stderr
    assert not target.exists()
