"""What an application's tests (and the demo) use, kept out of the runtime's own layers: nothing
below imports it, and the runtime runs without it.

* `scripted`: `ScriptedChatModel`, a deterministic chat model whose replies a policy decides,
  with bound tools, tool call ids and streaming as a provider's model has them.
* `faults`: `prove`, the faults kit behind `loopwright faults`: an agent's scenarios run clean,
  then under each fault at each write they sent, judged in the business system.

The crash points a test arms (`LOOPWRIGHT_CRASH_AT`, `CrashPoint`) are the runtime's own hook,
passed by its nodes, executor and savers: `loopwright.core.crashpoints`. The faults injected
around a write's send are the executor's: `loopwright.tools.faults`.
"""
