"""loopwright."""
