"""Chat models for the runtime: the deterministic scripted one and the factory choosing a model."""

from models.factory import make_model
from models.refund_procedure import RefundProcedure
from models.scripted import Decision, Policy, ScriptedChatModel

__all__ = ["Decision", "Policy", "RefundProcedure", "ScriptedChatModel", "make_model"]
