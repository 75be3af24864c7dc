"""Chat models for the runtime: OpenAI-compatible ones, each request bounded by the clock (the
scripted one is `loopwright.testing.scripted`)."""
