"""Argument helpers for the store's entry points: small, pure, and each error names its field."""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from local_store.errors import ValidationError
from local_store.records import optional_str, parse_memory_type, required_str
from local_store.redact import refuse_lone_surrogate, strip_private
from protocol.query import QueryRequest


def int_arg(args: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(name, f"must be an integer, got {type(value).__name__}")
    return min(high, max(low, value))


def query_request(request: object) -> QueryRequest:
    """A recall's arguments as a ``QueryRequest`` (decoded as the plane's serde does), checked
    and redacted (``redact_request``); arguments that are not an object are ``body``."""
    if not isinstance(request, QueryRequest):
        if not isinstance(request, Mapping):
            raise ValidationError("body", "must be a JSON object")
        try:
            request = msgspec.convert(dict(request), QueryRequest)
        except msgspec.ValidationError as exc:
            raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
    return redact_request(request)


def joined_strings(items: list[object], label: str) -> str:
    """A list of strings, comma-joined (a session summary's ``files``…). Each item must be a
    string: another value would be stored as its Python repr (``None``, ``{'path': …}``)."""
    texts: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise ValidationError(f"{label}[{index}]",
                                  f"must be a string, got {type(item).__name__}")
        texts.append(item)
    return ", ".join(texts)


def redact_request(request: QueryRequest) -> QueryRequest:
    """Recall input passes the redactor too: it reaches the embedder, SQL and debug logs.
    What no query can hold is refused, naming the field: text with a lone surrogate (no UTF-8
    text, so neither SQLite nor PostgreSQL, can hold it) and an ``importance_min`` that is not
    a finite number (NaN compares false with every importance: the recall would silently find
    nothing)."""
    low = request.importance_min
    if low is not None and not _finite(low):
        raise ValidationError("importance_min", "must be a finite number")
    return msgspec.structs.replace(
        request, query=_redacted(request.query, "query"),
        realms=[_redacted(r, f"realms[{i}]") for i, r in enumerate(request.realms)],
        tags=[_redacted(t, f"tags[{i}]") for i, t in enumerate(request.tags)],
        memory_type=_redacted(request.memory_type, "memory_type"),
        as_of=_redacted(request.as_of, "as_of"),
        space_agent=_redacted(request.space_agent, "space_agent"))


def _redacted(text: str | None, field: str) -> str | None:
    if text is None:
        return None
    refuse_lone_surrogate(text, field)
    return strip_private(text)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except (TypeError, OverflowError):  # a struct built in Python: an int beyond float range
        return False


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
        relation = optional_str(item, "relationship_type",
                                label=f"{label}.relationship_type") or "RELATES_TO"
        namespace = optional_str(item, "target_namespace", label=f"{label}.target_namespace")
        out.append((target, relation, namespace))
    return out
