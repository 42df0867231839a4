"""Argument helpers for the store's entry points: small, pure, and each error names its field."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from local_store.errors import ValidationError
from local_store.records import optional_str, parse_memory_type, required_str
from local_store.redact import strip_private
from protocol.query import QueryRequest


def int_arg(args: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(name, f"must be an integer, got {type(value).__name__}")
    return min(high, max(low, value))


def redact_request(request: QueryRequest) -> QueryRequest:
    """Recall input passes the redactor too: it reaches the embedder, SQL and debug logs."""
    return msgspec.structs.replace(
        request, query=strip_private(request.query),
        realms=[strip_private(r) for r in request.realms],
        tags=[strip_private(t) for t in request.tags],
        memory_type=None if request.memory_type is None else strip_private(request.memory_type),
        as_of=None if request.as_of is None else strip_private(request.as_of),
        space_agent=None if request.space_agent is None else strip_private(request.space_agent))


def msgspec_field(message: str) -> str:
    """The field named in a msgspec error: ``… - at `$.limit` `` → ``limit``; ``Object
    missing required field `x` - at `$.a` `` → ``a.x`` (``x`` at the top level)."""
    marker, missing = "at `$.", "missing required field `"
    path = message.split(marker, 1)[1].split("`", 1)[0] if marker in message else ""
    if missing in message:
        name = message.split(missing, 1)[1].split("`", 1)[0]
        return f"{path}.{name}" if path else name
    return path or "body"


def lenient_type(value: object) -> str:
    return parse_memory_type(value, {})


def like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def parse_links(value: object) -> list[tuple[str, str, str | None]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError("links", "must be a list of {target_node_id, relationship_type?}")
    out = []
    for index, item in enumerate(value):
        label = f"links[{index}]"
        if not isinstance(item, dict):
            raise ValidationError(label, "must be an object")
        target = required_str(item, "target_node_id", label=f"{label}.target_node_id")
        relation = optional_str(item, "relationship_type") or "RELATES_TO"
        namespace = optional_str(item, "target_namespace")
        out.append((target, relation, namespace))
    return out
