"""loopwright served over HTTP: the LangGraph server's graph entry, checkpointer, auth and inbox.

`langgraph.json` at the repository root names the pieces; `langgraph dev` (or `loopwright serve`)
and Aegra load them from here (docs/serving.md).
"""
