"""One module per node of the loop, and what the nodes are given: the run context (`context`)
and the agents' profiles a handoff moves between (`agents`)."""
