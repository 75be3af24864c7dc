"""The refund agent, loopwright's reference tenant: its tool contracts and rules
(`loopwright_refunds.agent`, the default agent of `loopwright demo`), the scripted procedure
that plays a well-behaved model (`procedure`) and misbehaving ones (`misbehaving`), the
reference business services (`services`) and the fault-injection experiment (`experiments`).

Everything here except the experiment's harness uses loopwright's public API only.
"""
