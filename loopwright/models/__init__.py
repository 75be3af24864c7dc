"""Chat models for the runtime: the deterministic scripted one, and OpenAI-compatible ones."""
