"""Benchmarks: scripts that measure the runtime under load or faults (not part of the test run)."""
