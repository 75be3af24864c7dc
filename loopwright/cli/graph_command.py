"""`loopwright graph`: the loop's graph as Mermaid text, or a PNG drawn offline by Graphviz."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from loopwright.cli.errors import UsageError
from loopwright.cli.output import console

app = typer.Typer()


@app.command()
def graph(
    png: Annotated[
        Path | None,
        typer.Option(
            "--png",
            metavar="FILE",
            help="Render the graph to this PNG file (needs Graphviz's dot).",
        ),
    ] = None,
) -> None:
    """Print the loop's graph as Mermaid text, or render it to a PNG offline."""
    from loopwright.graph.build import compile_graph

    drawable = compile_graph().get_graph()
    if png is None:
        console.print(drawable.draw_mermaid(), markup=False)
        return
    dot = shutil.which("dot")
    if dot is None:
        raise UsageError(
            "--png needs Graphviz's `dot` (Debian: apt-get install graphviz);"
            " without it, `loopwright graph` prints the graph as Mermaid text"
        )
    result = subprocess.run(
        [dot, "-Tpng", "-o", str(png)],
        input=graph_dot(drawable),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise UsageError(f"dot could not render the graph: {result.stderr.strip()}")
    console.print(f"wrote {png}", markup=False)


def graph_dot(drawable: Any) -> str:
    """The graph in Graphviz's language: routed (conditional) edges dashed, as in Mermaid."""
    lines = [
        "digraph loopwright {",
        '  graph [rankdir=TB, fontname="Helvetica"];',
        '  node [shape=box, style="rounded,filled", fillcolor="#eef0fb", fontname="Helvetica"];',
        '  edge [fontname="Helvetica"];',
    ]
    for node_id, node in drawable.nodes.items():
        label = {"__start__": "START", "__end__": "END"}.get(node_id, node.name)
        shape = ', shape=oval, fillcolor="#dddddd"' if node_id in ("__start__", "__end__") else ""
        lines.append(f'  "{node_id}" [label="{label}"{shape}];')
    for edge in drawable.edges:
        style = " [style=dashed]" if edge.conditional else ""
        lines.append(f'  "{edge.source}" -> "{edge.target}"{style};')
    lines.append("}")
    return "\n".join(lines) + "\n"
