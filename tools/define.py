"""Tool contracts from typed Python functions: what `Agent.read` and `Agent.write` build.

A read is `def get_thing(ctx: ToolContext[Deps], args: GetThing) -> Thing`; a write takes the
business intent key as a third argument, to send downstream as its idempotency key (or ignore,
for a downstream without keys): `def make_thing(ctx, args: MakeThing, key: str) -> Made`. The
argument and output models are pydantic models, read from the annotations: the argument model
is what the model is shown and what every call is validated against (an argument it does not
name is refused), the output model is the output contract every result must meet.

Everything else is declared next to the function (`ReadOptions`, `WriteOptions`), with the safe
defaults and the checks every contract gets (`ToolContract`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Unpack, get_type_hints

from pydantic import BaseModel

from loopwright.tools.contract import (
    Effect,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    synchronous,
)
from loopwright.tools.options import ReadOptions, WriteOptions, known_options

# What each kind of function takes, first to last.
_PARAMETERS = {Effect.READ: ("ctx", "args"), Effect.WRITE: ("ctx", "args", "intent_key")}


def _fail(name: str, problem: str) -> ToolDefinitionError:
    return ToolDefinitionError(f"tool {name}: {problem}")


def _model_of(fn: Callable[..., Any], name: str, param: str | None) -> type[BaseModel]:
    """The pydantic model annotated on `param` (None: the return annotation) of `fn`."""
    try:
        hints = get_type_hints(fn)
    except NameError as exc:
        raise _fail(
            name, f"its annotations cannot be resolved ({exc}); define the models at module level"
        ) from exc
    hint = hints.get(param or "return")
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return hint
    what = f"argument {param!r}" if param else "return value"
    raise _fail(name, f"annotate its {what} with a pydantic model (got {hint!r})")


def _description(fn: Callable[..., Any], given: str | None) -> str:
    """The first paragraph of the given description or the docstring, on one line (the
    contract refuses an empty one)."""
    text = given or inspect.getdoc(fn) or ""
    return text.strip().split("\n\n")[0].replace("\n", " ")


def function_contract(
    fn: Callable[..., Any], effect: Effect, options: Mapping[str, Any]
) -> ToolContract:
    """The contract of `fn` as a tool of `effect`, with the declared `options`. The argument and
    output models are given (`args_model=`, `output_model=`: one function serving a table of
    tools), else read from the annotations."""
    declared = known_options(options, str(options.get("name") or getattr(fn, "__name__", "?")))
    name = declared.pop("name", None) or fn.__name__
    synchronous(f"tool {name}", "the function", fn)
    params = _PARAMETERS[effect]
    found = list(inspect.signature(fn).parameters)
    if len(found) != len(params):
        raise _fail(name, f"the function takes ({', '.join(params)}), not ({', '.join(found)})")
    args_model = declared.pop("args_model", None) or _model_of(fn, name, found[1])
    output_model = declared.pop("output_model", None) or _model_of(fn, name, None)

    def run(ctx: ToolContext[Any], args: Any, key: str | None) -> Any:
        return fn(ctx, args) if effect is Effect.READ else fn(ctx, args, key or "")

    return ToolContract(
        name=name,
        description=_description(fn, declared.pop("description", None)),
        args_model=args_model,
        output_model=output_model,
        effect=effect,
        run=run,
        **declared,
    )


def read_tool(
    fn: Callable[[ToolContext[Any], Any], Any], /, **options: Unpack[ReadOptions]
) -> ToolContract:
    """The contract of a read: `fn(ctx, args) -> Output`. See `Agent.read`."""
    return function_contract(fn, Effect.READ, options)


def write_tool(
    fn: Callable[[ToolContext[Any], Any, str], Any], /, **options: Unpack[WriteOptions]
) -> ToolContract:
    """The contract of a write: `fn(ctx, args, intent_key) -> Output`. See `Agent.write`."""
    return function_contract(fn, Effect.WRITE, options)
