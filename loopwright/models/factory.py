"""A chat model from a spec string: what `--model` and `LOOPWRIGHT_MODEL` name.

`openai:<model>` is `ChatOpenAI` from langchain-openai on any OpenAI-compatible endpoint, with
the endpoint, key, API flavour, retries, timeout, streaming and reasoning effort from the
environment (`models.openai_chat.OpenAISettings.from_env`). Without a spec a run uses its
agent's own model (`Agent(model=...)`), which for the reference agent is the scripted one.
"""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel

ENV_VAR = "LOOPWRIGHT_MODEL"
ACCEPTED_SPECS = ("openai:<model>",)


def make_model(spec: str) -> BaseChatModel:
    """Build the model named by `spec`. Bad values raise ValueError."""
    provider, _, name = spec.partition(":")
    if provider == "openai" and name:
        # Imported here: the OpenAI client is slow to import and unused by scripted runs.
        from loopwright.models.openai_chat import OpenAISettings, make_openai_model

        return make_openai_model(OpenAISettings.from_env(name))
    msg = f"unknown model spec {spec!r}; expected one of: {', '.join(ACCEPTED_SPECS)}"
    raise ValueError(msg)
