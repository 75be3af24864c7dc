"""Tool contracts from typed Python functions: what `Agent.read` and `Agent.write` build.

A read is `def get_thing(ctx: ToolContext[Deps], args: GetThing) -> Thing`; a write takes the
business intent key as a third argument, to send downstream as its idempotency key (or ignore,
for a downstream without keys): `def make_thing(ctx, args: MakeThing, key: str) -> Made`. The
argument and output models are pydantic models, read from the annotations: the argument model
is what the model is shown and what every call is validated against (an argument it does not
name is refused), the output model is the output contract every result must meet.

Everything else is declared next to the function, with safe defaults: a write needs approval
unless told otherwise, is never re-sent unless its downstream dedupes by key, and cannot be
defined at all without its intent key and a way to learn its outcome (reconcile, or
`Guarantee.NONE`: every unknown outcome goes to a person). A definition that lacks what it
needs raises `ToolDefinitionError`, whose message says what to add.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict

from loopwright.graph.state import Action, Evidence
from loopwright.tools.contract import (
    Effect,
    Guarantee,
    Precondition,
    ReconcileResult,
    ReconcileStatus,
    ResendAfterDeadline,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    VerifyResult,
    synchronous,
)
from loopwright.tools.json_schema import JsonSchemaModel

# What a model may call a function (OpenAI's rule), the whole name (`fullmatch`: a `$` would
# let a trailing newline through).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A pydantic `pattern` anchors with ^ and $; finding an id in text needs it unanchored.
_ANCHORS = re.compile(r"^\^|\$$")

# Whether a write needs a person's approval: always (True, or a reason in words, which the
# approver is shown), never (False), or a function of the call answering True, a reason, or
# False/None.
ApprovalRule = bool | str | Callable[[ToolContext[Any], Any], bool | str | None]
Reconcile = (
    Callable[[ToolContext[Any], Action], ReconcileResult]
    | Callable[[ToolContext[Any], Action, dict[str, Any] | None], ReconcileResult]
)


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


def _closed(model: type[BaseModel]) -> type[BaseModel]:
    """`model`, refusing arguments it does not name (a model's call is never trimmed silently).

    A JSON Schema model is closed by its schema (see `schema_model`)."""
    if model.model_config.get("extra") == "forbid" or issubclass(model, JsonSchemaModel):
        return model
    config = ConfigDict(**{**model.model_config, "extra": "forbid"})
    namespace = {"model_config": config, "__module__": model.__module__, "__doc__": model.__doc__}
    return type(model.__name__, (model,), namespace)


def _given(model: Any, name: str, what: str) -> type[BaseModel]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    raise _fail(name, f"{what}= takes a pydantic model class (got {model!r})")


def _signature(
    fn: Callable[..., Any],
    name: str,
    params: Sequence[str],
    args: type[BaseModel] | None = None,
    output: type[BaseModel] | None = None,
) -> tuple[type[BaseModel], type[BaseModel]]:
    """The argument and output models: given (`args=`, `output=`: one function serving a table
    of tools), else read from the annotations."""
    synchronous(f"tool {name}", "the function", fn)
    found = list(inspect.signature(fn).parameters)
    if len(found) != len(params):
        raise _fail(name, f"the function takes ({', '.join(params)}), not ({', '.join(found)})")
    args_model = _given(args, name, "args") if args is not None else _model_of(fn, name, found[1])
    output_model = (
        _given(output, name, "output") if output is not None else _model_of(fn, name, None)
    )
    return _closed(args_model), output_model


def _description(fn: Callable[..., Any], given: str | None, name: str) -> str:
    text = given or inspect.getdoc(fn) or ""
    if not text.strip():
        raise _fail(name, "give it a docstring or description=...: the model reads it")
    return text.strip().split("\n\n")[0].replace("\n", " ")


def _name(fn: Callable[..., Any], given: str | None) -> str:
    name = given or fn.__name__
    if not TOOL_NAME.fullmatch(name):
        raise ToolDefinitionError(f"tool name {name!r} is not a valid function name")
    return name


def _fields(model: type[BaseModel], names: Collection[str], name: str, what: str) -> None:
    unknown = sorted(set(names) - set(model.model_fields))
    if unknown:
        raise _fail(name, f"{what} names {', '.join(unknown)}, which {model.__name__} lacks")


def _produced(
    output: type[BaseModel], produces: Sequence[str] | Mapping[str, str], name: str
) -> dict[str, str]:
    """Each produced identifier field with the pattern that finds it in text."""
    given = dict(produces) if isinstance(produces, Mapping) else dict.fromkeys(produces, "")
    _fields(output, given, name, "produces")
    properties = output.model_json_schema().get("properties", {})
    patterns = {}
    for field, pattern in given.items():
        pattern = pattern or properties.get(field, {}).get("pattern", "")
        if not pattern:
            raise _fail(
                name,
                f"produces {field!r} has no pattern: give produces={{{field!r}: r'...'}} "
                "or a Field(pattern=...) on the output model",
            )
        patterns[field] = _ANCHORS.sub("", pattern)
    return patterns


def _approval(
    rule: ApprovalRule, tool: str
) -> Callable[[ToolContext[Any], Any], bool | str | None]:
    """The contract's approval rule; one that always asks says so as its reason."""
    if callable(rule):
        return rule
    if rule is True:
        rule = f"every call of {tool} needs a person's approval (its contract says so)"
    return lambda _ctx, _args: rule


def _reconcile_with_pre_image(
    reconcile: Reconcile,
) -> Callable[[ToolContext[Any], Action, dict[str, Any] | None], ReconcileResult]:
    """Reconcile functions take (ctx, action) or, with a pre-image, (ctx, action, pre_image)."""
    if len(inspect.signature(reconcile).parameters) == 3:
        return reconcile  # type: ignore[return-value]
    two: Callable[[ToolContext[Any], Action], ReconcileResult] = reconcile  # type: ignore[assignment]
    return lambda ctx, action, _pre_image: two(ctx, action)


def verified_by_reconcile(
    reconcile: Callable[[ToolContext[Any], Action, dict[str, Any] | None], ReconcileResult],
) -> Callable[[ToolContext[Any], Action], VerifyResult]:
    """Verification as a second question to the business system: is the intent applied?"""

    def verify(ctx: ToolContext[Any], action: Action) -> VerifyResult:
        answer = reconcile(ctx, action, None)
        if answer.status is ReconcileStatus.APPLIED:
            return VerifyResult(True, dict(answer.outcome or action.outcome or {}))
        detail = answer.detail or str(answer.status)
        return VerifyResult(False, {}, f"{action.tool} {action.action_id}: {detail}")

    return verify


def read_tool(
    fn: Callable[[ToolContext[Any], Any], Any],
    *,
    name: str | None = None,
    description: str | None = None,
    args: type[BaseModel] | None = None,
    output: type[BaseModel] | None = None,
    resources: Callable[[Any], Iterable[str]] | None = None,
    authorize: Callable[[ToolContext[Any], Any], bool | None] | None = None,
    poll_after: Callable[[dict[str, Any]], float | None] | None = None,
    timeout_s: float = 5.0,
    max_attempts: int = 2,
    max_result_bytes: int = 64_000,
    sensitive: Collection[str] = (),
) -> ToolContract:
    """The contract of a read: `fn(ctx, args) -> Output`. See `Agent.read`."""
    tool = _name(fn, name)
    args_model, output_model = _signature(fn, tool, ("ctx", "args"), args, output)
    _fields(args_model, sensitive, tool, "sensitive")
    optional: dict[str, Any] = {
        k: v for k, v in {"resources": resources, "authorize": authorize}.items() if v is not None
    }
    return ToolContract(
        name=tool,
        description=_description(fn, description, tool),
        args_model=args_model,
        output_model=output_model,
        effect=Effect.READ,
        run=lambda ctx, args, _key: fn(ctx, args),
        poll_after=poll_after,
        timeout_s=timeout_s,
        max_attempts=max_attempts,
        max_result_bytes=max_result_bytes,
        sensitive_fields=frozenset(sensitive),
        **optional,
    )


def write_tool(
    fn: Callable[[ToolContext[Any], Any, str], Any],
    *,
    intent: Callable[[str, Any], str] | None,
    guarantee: Guarantee = Guarantee.NONE,
    reconcile: Reconcile | None = None,
    verify: Callable[[ToolContext[Any], Action], VerifyResult] | None = None,
    needs_approval: ApprovalRule = True,
    preconditions: Precondition | Sequence[Precondition] = (),
    pre_image: Callable[[ToolContext[Any], Any], dict[str, Any]] | None = None,
    current_versions: Callable[[ToolContext[Any], Any], dict[str, str]] | None = None,
    compensation: Callable[[Action], str] | None = None,
    summary: Callable[[Any], str] | None = None,
    produces: Sequence[str] | Mapping[str, str] = (),
    resources: Callable[[Any], Iterable[str]] | None = None,
    authorize: Callable[[ToolContext[Any], Any], bool | None] | None = None,
    sensitive: Collection[str] = (),
    editable: Collection[str] = (),
    facts: Callable[[Any, Sequence[Evidence]], Iterable[tuple[str, str]]] | None = None,
    confirm: Callable[[Any], bool] | None = None,
    resend: ResendAfterDeadline | None = None,
    replaces: Collection[str] = (),
    timeout_s: float = 5.0,
    max_result_bytes: int = 64_000,
    name: str | None = None,
    description: str | None = None,
    args: type[BaseModel] | None = None,
    output: type[BaseModel] | None = None,
) -> ToolContract:
    """The contract of a write: `fn(ctx, args, intent_key) -> Output`. See `Agent.write`."""
    tool = _name(fn, name)
    args_model, output_model = _signature(fn, tool, ("ctx", "args", "intent_key"), args, output)
    _fields(args_model, sensitive, tool, "sensitive")
    _fields(args_model, editable, tool, "editable")
    if intent is None:
        raise _fail(
            tool,
            "a write needs its business intent key: intent=lambda run_id, args: "
            "f'<what>:{run_id}:<the target>' (one intent per business effect, never a call id)",
        )
    if guarantee is not Guarantee.NONE and reconcile is None:
        raise _fail(
            tool,
            f"guarantee {guarantee.value} needs reconcile=... (how to ask the business system "
            "whether an intent happened), or declare guarantee=Guarantee.NONE (every unknown "
            "outcome then goes to a person)",
        )
    if resend is not None and guarantee is not Guarantee.QUERYABLE:
        raise _fail(
            tool,
            "resend= is for a downstream without keys (guarantee=Guarantee.QUERYABLE): one that "
            "dedupes by key is re-sent under its key, one that cannot be asked never is",
        )
    synchronous(f"tool {tool}", "reconcile", reconcile)  # wrapped below: checked here
    full_reconcile = _reconcile_with_pre_image(reconcile) if reconcile is not None else None
    if verify is None:
        if full_reconcile is None or pre_image is not None:
            raise _fail(
                tool,
                "declare verify=... (how to check in the business system that a succeeded "
                "write is there): without it no run with this write can be verified complete",
            )
        verify = verified_by_reconcile(full_reconcile)
    rules = (preconditions,) if callable(preconditions) else tuple(preconditions)
    optional: dict[str, Any] = {
        k: v for k, v in {"resources": resources, "authorize": authorize}.items() if v is not None
    }
    return ToolContract(
        name=tool,
        description=_description(fn, description, tool),
        args_model=args_model,
        output_model=output_model,
        effect=Effect.WRITE,
        run=lambda ctx, args, key: fn(ctx, args, key or ""),
        needs_approval=_approval(needs_approval, tool),
        preconditions=rules,
        intent_key=intent,
        pre_image=pre_image,
        reconcile=full_reconcile,
        verify=verify,
        summarize=summary,
        produces=_produced(output_model, produces, tool),
        current_versions=current_versions,
        compensation=compensation,
        guarantee=guarantee,
        resend=resend,
        replaces=frozenset(replaces),
        timeout_s=timeout_s,
        max_result_bytes=max_result_bytes,
        sensitive_fields=frozenset(sensitive),
        editable=frozenset(editable),
        facts=facts,
        confirm=confirm,
        **optional,
    )
