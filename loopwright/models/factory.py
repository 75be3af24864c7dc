"""A chat model from a spec string: what `--model` and `LOOPWRIGHT_MODEL` name.

`openai:<model>` is `ChatOpenAI` from langchain-openai on any OpenAI-compatible endpoint, with
the endpoint, key, API flavour, retries, timeout, streaming and reasoning effort from the
environment (`models.openai_chat.OpenAISettings.from_env`). Without a spec a run uses its
agent's own model (`Agent(model=...)`), which for the reference agent is the scripted one.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel

ENV_VAR = "LOOPWRIGHT_MODEL"
ACCEPTED_SPECS = ("openai:<model>",)


def make_model(spec: str, recorded: dict[str, Any] | None = None) -> BaseChatModel:
    """Build the model named by `spec` (its settings from the environment, or as a run
    `recorded` them: see `model_settings`). Bad values raise ValueError."""
    provider, _, name = spec.partition(":")
    if provider == "openai" and name:
        # Imported here: the OpenAI client is slow to import and unused by scripted runs.
        from loopwright.models.openai_chat import (
            OpenAISettings,
            make_openai_model,
            settings_from_record,
        )

        if recorded:
            return make_openai_model(settings_from_record(recorded))
        return make_openai_model(OpenAISettings.from_env(name))
    msg = f"unknown model spec {spec!r}; expected one of: {', '.join(ACCEPTED_SPECS)}"
    raise ValueError(msg)


def model_settings(model: BaseChatModel) -> dict[str, Any]:
    """What a run records of its model's settings (API, base URL, streaming, temperature, ...),
    for the models loopwright builds from a spec; {} for others."""
    settings = getattr(model, "settings", None)
    if settings is None or not hasattr(settings, "model_dump"):
        return {}
    from loopwright.models.openai_chat import recorded_settings

    return recorded_settings(settings)


def changed_settings(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How `current` settings differ from those a run `recorded`, one "name now (recorded
    was)" each; empty when they are the same."""
    return [
        f"{name} {current.get(name)!r}, recorded {recorded.get(name)!r}"
        for name in sorted(set(recorded) | set(current))
        if recorded.get(name) != current.get(name)
    ]
