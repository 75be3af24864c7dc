"""The loop as a graph: its topology and routing over the nodes (`build`)."""
