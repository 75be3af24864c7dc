"""Whether a declared MCP tool still fits what its server lists, said as problems in words.

A declaration names a tool and gives its argument model (and perhaps its output model); the
server's listing gives its input schema, output schema and annotations. They must agree where a
difference would break a call or a promise: every argument the server requires is declared and
required, every declared argument is one the server takes, a shared argument has a type the
server accepts (an integer where it takes a number is fine), and the fields a declared output
contract requires are in the server's output schema. An argument the server takes but does not
require, left out of the declaration, is simply never sent. A tool declared a read that the
server itself calls destructive or not read-only is refused: the server's hints never make a
tool a read, but one that says it writes is believed.
"""

from __future__ import annotations

from typing import Any

from mcp.types import Tool

from loopwright.tools.contract import Effect, ToolContract


def _types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a property schema allows (empty: it does not say, e.g. a `$ref`)."""
    if "type" in schema:
        given = schema["type"]
        return {given} if isinstance(given, str) else set(given)
    found: set[str] = set()
    for member in schema.get("anyOf", []) + schema.get("oneOf", []):
        allowed = _types(member)
        if not allowed:
            return set()  # one member says nothing: neither does the whole
        found |= allowed
    return found


def _not_accepted(declared: set[str], listed: set[str]) -> set[str]:
    """The declared types the listed ones do not accept (a number accepts an integer)."""
    if not declared or not listed:
        return set()
    accepted = listed | ({"integer"} if "number" in listed else set())
    return declared - accepted


def _shape(schema: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    return dict(schema.get("properties") or {}), set(schema.get("required") or [])


def _argument_differences(declared: dict[str, Any], listed: dict[str, Any]) -> list[str]:
    ours, our_required = _shape(declared)
    theirs, their_required = _shape(listed)
    problems = [
        f"argument {name} is not in the server's schema" for name in sorted(set(ours) - set(theirs))
    ]
    for name in sorted(their_required):
        if name not in ours:
            problems.append(f"the server requires argument {name}, which the declaration lacks")
        elif name not in our_required:
            problems.append(
                f"the server requires argument {name}, which the declaration makes optional"
            )
    for name in sorted(set(ours) & set(theirs)):
        if wrong := _not_accepted(_types(ours[name]), _types(theirs[name])):
            problems.append(
                f"argument {name} may be {', '.join(sorted(wrong))} in the declaration, which"
                f" the server's schema does not take ({', '.join(sorted(_types(theirs[name])))})"
            )
    return problems


def _output_differences(declared: dict[str, Any], listed: dict[str, Any]) -> list[str]:
    ours, our_required = _shape(declared)
    theirs, _ = _shape(listed)
    problems = []
    for name in sorted(our_required):
        if name not in theirs:
            problems.append(f"its answer has no field {name}, which the output model requires")
        elif wrong := _not_accepted(_types(theirs[name]), _types(ours[name])):
            problems.append(
                f"its answer's field {name} may be {', '.join(sorted(wrong))}, which the output"
                " model does not take"
            )
    return problems


def differences(contract: ToolContract, listed: Tool, *, output_declared: bool) -> list[str]:
    """Why `contract` no longer fits the server's listing of its tool (empty: it fits);
    `output_declared`: its output model is the team's own, not the default answer."""
    problems = _argument_differences(contract.args_model.model_json_schema(), listed.input_schema)
    if output_declared and listed.output_schema is not None:
        problems += _output_differences(
            contract.output_model.model_json_schema(), listed.output_schema
        )
    hints = listed.annotations
    says_it_writes = hints is not None and (
        hints.read_only_hint is False or hints.destructive_hint is True
    )
    if contract.effect is Effect.READ and says_it_writes:
        problems.append("declared a read, but the server says it is not read-only")
    return problems
