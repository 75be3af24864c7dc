"""Choose the chat model a run uses, from a spec string or the environment.

The scripted model is the default so that the demo and the tests run offline and
deterministically; a real model is opted into with `LOOPWRIGHT_MODEL=openai:<model>` (or the
CLI's `--model openai:<model>`).
"""

from __future__ import annotations

import os

from langchain_core.language_models import BaseChatModel

from loopwright.models.scripted import ScriptedChatModel
from loopwright_refunds.procedure import RefundProcedure

ENV_VAR = "LOOPWRIGHT_MODEL"
ACCEPTED_SPECS = ("scripted", "openai:<model>")


def make_model(spec: str | None = None) -> BaseChatModel:
    """Build the model named by `spec`, or by `$LOOPWRIGHT_MODEL` when `spec` is None.

    For `openai:<model>`, the endpoint, key, API flavour, retries, timeout, streaming and
    reasoning effort come from the environment (`models.openai_chat.OpenAISettings.from_env`:
    `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `LOOPWRIGHT_OPENAI_API` = "responses" or "chat", ...).
    A missing key becomes a placeholder so that keyless OpenAI-compatible local servers work.
    Bad values raise ValueError.
    """
    if spec is None:
        spec = os.environ.get(ENV_VAR) or "scripted"
    if spec == "scripted":
        return ScriptedChatModel(policy=RefundProcedure())
    provider, _, name = spec.partition(":")
    if provider == "openai" and name:
        # Imported here: the OpenAI client is slow to import and unused by scripted runs.
        from loopwright.models.openai_chat import OpenAISettings, make_openai_model

        return make_openai_model(OpenAISettings.from_env(name))
    msg = f"unknown model spec {spec!r}; expected one of: {', '.join(ACCEPTED_SPECS)}"
    raise ValueError(msg)
