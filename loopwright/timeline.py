"""A readable line per committed node step: what was decided, checked, done and found."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from rich.console import Console
from rich.markup import escape

from graph.protocol import parse_tool_content
from graph.state import Action, PendingCall, Verification


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in args.items())


def describe_step(node: str, update: dict[str, Any]) -> list[str]:
    """Plain-text lines (rich markup) for one node's committed update."""
    lines: list[str] = []
    if update.get("stop_reason") and node != "verify":
        lines.append(
            f"[bold red]stop[/]: {update['stop_reason']} ({escape(update.get('stop_detail', ''))})"
        )
    for item in update.get("history") or []:
        if isinstance(item, AIMessage):
            for call in item.tool_calls:
                lines.append(f"decides [cyan]{call['name']}[/]({escape(_args(call['args']))})")
            if not item.tool_calls and not item.invalid_tool_calls:
                lines.append(f"answers: [italic]{escape(item.text)}[/]")
        elif isinstance(item, ToolMessage):
            envelope = parse_tool_content(str(item.content))
            if envelope.status == "ok":
                lines.append(f"{item.name} [green]ok[/]")
            else:
                error = envelope.error or {}
                lines.append(
                    f"{item.name} [red]{envelope.status}[/]: {error.get('code')} {escape(str(error.get('detail', '')))}"
                )
    if node == "validate":
        for pending in (PendingCall.model_validate(p) for p in update.get("pending") or []):
            if pending.verdict == "ready":
                lines.append(f"allows [cyan]{pending.tool}[/] for {pending.call_id}")
            elif pending.verdict == "needs_approval" and pending.approval is not None:
                request = pending.approval
                lines.append(
                    f"[yellow]needs approval[/]: {escape(request.summary)} ({request.approval_id})"
                )
    for record in update.get("approvals") or []:
        lines.append(
            f"{record['decision']}d by {record['approver']} (digest {record['digest'][:12]})"
        )
    for raw in (update.get("journal") or {}).values():
        action = Action.model_validate(raw)
        lines.append(
            f"action {action.action_id} {action.tool} [bold]{action.status}[/] (attempts {action.attempts})"
        )
    if update.get("verification"):
        v = Verification.model_validate(update["verification"])
        mark = "[green]verified[/]" if v.verified else "[red]not verified[/]"
        lines.append(f"{mark}: {escape(v.summary)}" + "".join(f"; {escape(p)}" for p in v.problems))
    return lines


class TimelinePrinter:
    """A StepListener that prints the timeline as the run advances."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.step = 0

    def __call__(self, node: str, update: dict[str, Any]) -> None:
        self.step += 1
        lines = describe_step(node, update) or [f"phase {update.get('phase', '')}".strip()]
        self.console.print(f"[dim]{self.step:3d}[/] [bold]{node:<15}[/] {lines[0]}")
        for line in lines[1:]:
            self.console.print(f"{'':19} {line}")
