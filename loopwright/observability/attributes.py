"""What spans say of a tool call's arguments and of a run's usage: the arguments' digest, and the
arguments themselves only with raw capture on (`LOOPWRIGHT_TRACE_RAW_ARGS`), their sensitive
fields always redacted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.util.types import AttributeValue

from loopwright.core.state import canonical_json
from loopwright.observability.redaction import redact, redacted_digest
from loopwright.observability.tracing import capture_raw_args

Attributes = dict[str, AttributeValue]


def args_attributes(args: Mapping[str, Any], sensitive: frozenset[str]) -> Attributes:
    """The digest of a call's arguments, and the (redacted) arguments with raw capture on."""
    attributes: Attributes = {"loopwright.tool.args_digest": redacted_digest(args, sensitive)}
    if capture_raw_args():
        attributes["loopwright.tool.args"] = canonical_json(redact(args, sensitive))
    return attributes


def usage_attributes(usage: Mapping[str, Any]) -> Attributes:
    """A run's usage so far (a `Usage` dump), each count as `loopwright.usage.NAME`."""
    return {f"loopwright.usage.{k}": v for k, v in usage.items() if isinstance(v, int | float)}
