"""Chat models for the runtime: the deterministic scripted one and the factory choosing a model."""

from loopwright.models.factory import make_model
from loopwright.models.scripted import Decision, Policy, ScriptedChatModel
from loopwright_refunds.procedure import RefundProcedure

__all__ = ["Decision", "Policy", "RefundProcedure", "ScriptedChatModel", "make_model"]
