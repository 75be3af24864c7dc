"""The refund agent, loopwright's reference tenant: its tool contracts and rules
(`loopwright_refunds.agent`, the default agent of `loopwright demo`), the scripted procedure
that plays a well-behaved model (`procedure`) and misbehaving ones (`misbehaving`), the
reference business services (`services`), the fault-injection experiment (`experiments`) and
the throwaway databases it, the tests and the benchmarks run on (`scratch`).

Everything here except the experiment's harness uses loopwright's public API only. It is a
distribution of its own, `loopwright-refunds` (`refunds/pyproject.toml`), so that the runtime's
wheel carries no reference agent; it requires the runtime of its own version.
"""

__version__ = "0.2.0"
