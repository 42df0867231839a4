"""Pure input handling for the write path: validate, redact, fold, normalise.

Rules:
  * Redaction runs first, on every string of the input (keys included), before validation,
    truncation, previews, hashing or embedding (RELIABILITY P1).
  * Every error is a ``ValidationError`` naming the field; these functions never touch SQLite.
  * ``why``/``where``/``learned`` fold into content exactly as the control plane does:
    ``content + "\\nWhy: …" + "\\nWhere: …" + "\\nLearned: …"`` for the non-blank ones, trimmed.
  * Unknown memory types coerce to ``fact`` (as the plane does) and the coercion is reported.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from local_store.errors import ValidationError
from local_store.redact import (
    REDACTED,
    has_private_tag,
    refuse_lone_surrogate,
    strip_json_object,
    strip_json_strings,
    strip_private_json_text,
)
from protocol.timestamp import TimestampError, canonical

MEMORY_TYPES = ("fact", "decision", "preference", "learning", "summary", "procedure", "entity")
STATUSES = ("active", "background", "archived")
DEFAULT_REALM = "default"
DEFAULT_IMPORTANCE = 0.5
PREVIEW_CHARS = 280
MAX_CONTENT_CHARS = 256 * 1024
MAX_TITLE_CHARS = 1000
MAX_REALM_CHARS = 200
MAX_TAGS = 64
MAX_TAG_CHARS = 200
MAX_KEY_CHARS = 500
# The tag of an entity ``memory_note`` made for an edge target not yet noted: it stands for a
# name, holds no knowledge, and recall never injects it (``recall.py``, the confident tier).
PLACEHOLDER_TAG = "placeholder"


def is_placeholder(tags: str | None) -> bool:
    """Whether a memory's comma-joined ``tags`` mark it a placeholder."""
    return PLACEHOLDER_TAG in (tags or "").split(",")

_SLUG_RUNS = re.compile(r"[\W_]+")
_WS = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(slots=True)
class Draft:
    """A validated, redacted memory version, not yet stamped or identified."""

    realm: str
    memory_type: str
    content: str
    title: str | None = None
    tags: str = ""
    importance: float = DEFAULT_IMPORTANCE
    status: str = "active"
    topic_key: str | None = None
    valid_at: str | None = None
    source_session_id: str | None = None
    source_run_id: str | None = None
    provenance: str | None = None
    memory_class: str | None = None
    space: str | None = None
    writer_agent_id: str | None = None
    source_uris: str | None = None
    mentions: str | None = None
    dedupe_key: str | None = None
    references: tuple[str, ...] = ()
    coerced: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------- scalars

def optional_str(args: Mapping[str, object], name: str, *, limit: int = MAX_KEY_CHARS,
                 label: str | None = None) -> str | None:
    """A trimmed string or None for missing/blank; anything else is an error naming the field."""
    value = args.get(name)
    label = label or name
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(label, f"must be a string, got {type(value).__name__}")
    value = value.strip()
    if len(value) > limit:
        raise ValidationError(label, f"must be at most {limit} characters, got {len(value)}")
    return value or None


def required_str(args: Mapping[str, object], name: str, *, limit: int = MAX_KEY_CHARS,
                 label: str | None = None) -> str:
    value = optional_str(args, name, limit=limit, label=label)
    if value is None:
        raise ValidationError(label or name, "is required and must be a non-empty string")
    return value


def parse_realm(value: object, label: str = "realm") -> str:
    if value is None:
        return DEFAULT_REALM
    if not isinstance(value, str):
        raise ValidationError(label, f"must be a string, got {type(value).__name__}")
    realm = value.strip()
    if not realm:
        return DEFAULT_REALM
    if len(realm) > MAX_REALM_CHARS or _CONTROL.search(realm):
        raise ValidationError(label, f"must be at most {MAX_REALM_CHARS} printable characters")
    return realm


def parse_memory_type(value: object, coerced: dict[str, str], label: str = "memory_type") -> str:
    """Lenient like the plane: trimmed, lower-cased, unknown → ``fact`` (reported in ``coerced``)."""
    if value is None:
        return "fact"
    if not isinstance(value, str):
        raise ValidationError(label, f"must be a string, got {type(value).__name__}")
    kind = value.strip().lower()
    if kind in MEMORY_TYPES:
        return kind
    if kind:
        coerced[label] = f"unknown memory_type {value[:60]!r} stored as 'fact'"
    return "fact"


def parse_status(value: object, label: str = "status") -> str:
    if not isinstance(value, str) or value.strip().lower() not in STATUSES:
        raise ValidationError(label, "must be active|background|archived")
    return value.strip().lower()


def parse_importance(value: object, label: str = "importance",
                     coerced: dict[str, str] | None = None) -> float:
    """A finite number, clamped to [0, 1] as the plane does (a clamp is reported in
    ``coerced`` when given)."""
    if value is None:
        return DEFAULT_IMPORTANCE
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(label, f"must be a number between 0 and 1, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range (JSON allows 1 followed by 400 zeros)
        raise ValidationError(label, "must be a finite number between 0 and 1") from None
    if not math.isfinite(number):
        raise ValidationError(label, f"must be a finite number, got {number}")
    clamped = min(1.0, max(0.0, number))
    if clamped != number and coerced is not None:
        coerced[label] = f"importance {number:g} is outside 0..1: stored as {clamped:g}"
    return clamped


def parse_timestamp(value: object, label: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(label, f"must be an RFC 3339 string, got {type(value).__name__}")
    if not value or value[0].isspace() or value[-1].isspace():
        value = value.strip()
        if not value:
            return None
    try:
        return canonical(value)
    except TimestampError as exc:  # the message quotes the value: never a private span
        message = str(exc) if not _private(value) else "invalid RFC 3339 timestamp"
        raise ValidationError(label, message) from None


def parse_tags(value: object, label: str = "tags") -> str:
    """A list of strings → the plane's comma-joined form (trimmed, blank dropped, de-duplicated)."""
    if value is None:
        return ""
    if not isinstance(value, list | tuple):
        raise ValidationError(label, "must be a list of strings")
    if len(value) > MAX_TAGS:
        raise ValidationError(label, f"must have at most {MAX_TAGS} tags, got {len(value)}")
    tags: list[str] = []
    for index, tag in enumerate(value):
        where = f"{label}[{index}]"
        if not isinstance(tag, str):
            raise ValidationError(where, f"must be a string, got {type(tag).__name__}")
        tag = tag.strip()
        if "," in tag:
            raise ValidationError(where, "must not contain a comma (tags are comma-joined on the wire)")
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationError(where, f"must be at most {MAX_TAG_CHARS} characters")
        if tag and tag not in tags:
            tags.append(tag)
    return ",".join(tags)


def parse_id_list(value: object, label: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValidationError(label, "must be a list of strings")
    out: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ValidationError(f"{label}[{index}]", "must be a non-empty string")
        if item.strip() not in out:
            out.append(item.strip())
    return tuple(out)


def normalise_memory_id(value: object, label: str = "memory_id") -> str:
    """Accept ``memory:<uuid>`` or a bare uuid (as the plane's tools do)."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(label, "is required and must be a non-empty string")
    text = value.strip()
    refuse_private_id(text, label)
    return text if text.startswith("memory:") else f"memory:{text}"


def refuse_private_id(value: str, label: str) -> None:
    """Ids are identity, so they are never rewritten: one holding a private span is refused
    (without echoing it), as is one no UTF-8 text (nor SQLite) can hold: a lone surrogate."""
    refuse_lone_surrogate(value, label)
    if _private(value):
        raise ValidationError(label, "must not contain <private> content")


def _private(value: str) -> bool:
    return has_private_tag(value)


def refuse_private_identity(raw: Mapping[str, object], label: str = "") -> None:
    """Identity keys in a request's raw arguments — ``topic_key``, ``target_node_id`` and
    ``relationship_type`` (an edge's id is its ends and type), the ids in ``references``, and
    ``links[]``' targets and types — are never rewritten by the redactor: two different
    private keys would both become ``[redacted]`` and merge into one memory or one edge. One
    holding a private span is refused, naming its field."""
    p = f"{label}." if label else ""
    for name in ("topic_key", "target_node_id", "relationship_type"):
        value = raw.get(name)
        if isinstance(value, str):
            refuse_private_id(value, f"{p}{name}")
    for name, key in (("references", ""), ("links", "target_node_id"),
                      ("links", "relationship_type")):
        items = raw.get(name)
        if not isinstance(items, list | tuple):
            continue
        for index, item in enumerate(items):
            value = item.get(key) if key and isinstance(item, Mapping) else item
            if isinstance(value, str):
                refuse_private_id(value, f"{p}{name}[{index}]" + (f".{key}" if key else ""))


# ---------------------------------------------------------------------------- derived text

def fold_content(content: str, why: str | None, where: str | None, learned: str | None) -> str:
    for label, extra in (("Why", why), ("Where", where), ("Learned", learned)):
        if extra and extra.strip():
            content += f"\n{label}: {extra.strip()}"
    return content


def preview(content: str) -> str:
    text = content.strip() if content[:1].isspace() or content[-1:].isspace() else content
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def slug(name: str) -> str:
    """The plane's slug: lowercase, every run of characters that are not letters or digits
    (Unicode ones included, as Rust's ``char::is_alphanumeric``) becomes ``-``, ends trimmed.
    ``東京`` stays ``東京``: an ASCII-only slug made every such name ``""``, one entity."""
    return _SLUG_RUNS.sub("-", name.lower()).strip("-")


def dedupe_key(realm: str, memory_type: str, content: str) -> str:
    """Same realm, type and whitespace/case-normalised content → the same key."""
    normal = _WS.sub(" ", content.strip().lower())
    return hashlib.sha256(f"{realm}\x1f{memory_type}\x1f{normal}".encode()).hexdigest()[:32]


def new_memory_id() -> str:
    return f"memory:{uuid.uuid4()}"


# Arguments that may hold JSON as text: ``strip_json_object`` redacts such text as plain text,
# where a literal closer hides the structure before it and leaves an escaped span unread.
JSON_TEXT_ARGS = ("provenance", "source_uris", "mentions")


def json_text(value: object, label: str) -> str | None:
    """Objects become compact JSON text; strings stay as given (the wire keeps JSON in strings)."""
    if value is None:
        return None
    if isinstance(value, str):
        return strip_private_json_text(value, label)
    if isinstance(value, dict | list):
        return strict_json(value, label)
    raise ValidationError(label, "must be an object or a JSON string")


def strict_json(value: object, label: str) -> str:
    """Compact JSON text with sorted keys, and always JSON: NaN and Infinity (which Python's
    ``json`` would write, and every strict reader — the plane's — refuses), keys that do not
    sort (``{1: …, "b": …}``) and values JSON has no form for are refused, naming the field."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True,
                          allow_nan=False)
    except (ValueError, TypeError) as exc:  # NaN/Infinity; keys of mixed types; a set, bytes…
        raise ValidationError(label, f"must be valid JSON: {exc}") from None


class _NotJson(ValueError):
    """A constant Python's ``json`` reads and JSON has not (``NaN``, ``Infinity``)."""


def _not_json(name: str) -> object:
    raise _NotJson(name)


def _json_float(text: str) -> float:
    """A JSON number beyond float range (``1e400``) reads as infinity, which JSON has not:
    a strict reader (the plane's) refuses the text, so it is not JSON here either."""
    number = float(text)
    if not math.isfinite(number):
        raise _NotJson(text)
    return number


def stamp_provenance(given: object, writer: Mapping[str, object],
                     label: str = "provenance") -> str:
    """Merge the writer stamp into an object provenance; wrap any other value as the plane does.
    Text that is JSON only to Python (``NaN``, ``Infinity``) is not JSON: wrapped as text, as
    the plane's strict parser leaves it."""
    base: dict[str, object]
    if given is None:
        base = {}
    elif isinstance(given, dict):
        base = dict(given)
    elif isinstance(given, str):
        try:
            parsed = json.loads(given, parse_constant=_not_json, parse_float=_json_float)
        except RecursionError:
            raise ValidationError(label, "is nested too deeply") from None
        except ValueError:  # not JSON (NaN and Infinity included, _NotJson): kept as text
            parsed = given
        base = dict(parsed) if isinstance(parsed, dict) else {"value": parsed}
    else:
        raise ValidationError(label, "must be an object or a JSON string")
    base["writer"] = dict(writer)
    clean = strip_json_strings(base, label)  # tags may hide behind \u escapes
    return strict_json(clean, label)


# ---------------------------------------------------------------------------- save

def build_save(raw: Mapping[str, object], writer: Mapping[str, object], *,
               label: str = "") -> Draft:
    """Turn the ``save_memory`` arguments into a Draft (redacted, folded, validated)."""
    if not isinstance(raw, Mapping):
        raise ValidationError(label or "body", "must be a JSON object")
    refuse_private_identity(raw, label)
    args = strip_json_object(raw)
    p = f"{label}." if label else ""
    for name in JSON_TEXT_ARGS:  # JSON given as text: its own strings are redacted, decoded
        if isinstance(given := raw.get(name), str):
            args[name] = strip_private_json_text(given, f"{p}{name}")
    coerced: dict[str, str] = {}
    content = args.get("content")
    if not isinstance(content, str):
        raise ValidationError(f"{p}content", "is required and must be a string")
    why = optional_str(args, "why", limit=MAX_CONTENT_CHARS, label=f"{p}why")
    where = optional_str(args, "where", limit=MAX_CONTENT_CHARS, label=f"{p}where")
    learned = optional_str(args, "learned", limit=MAX_CONTENT_CHARS, label=f"{p}learned")
    content = checked_content(fold_content(content, why, where, learned), raw.get("content"),
                              f"{p}content")
    realm = parse_realm(args.get("realm"), f"{p}realm")
    memory_type = parse_memory_type(args.get("memory_type"), coerced, f"{p}memory_type")
    return Draft(
        realm=realm,
        memory_type=memory_type,
        content=content,
        title=optional_str(args, "title", limit=MAX_TITLE_CHARS, label=f"{p}title"),
        tags=parse_tags(args.get("tags"), f"{p}tags"),
        importance=parse_importance(args.get("importance"), f"{p}importance", coerced),
        topic_key=optional_str(args, "topic_key", label=f"{p}topic_key"),
        valid_at=parse_timestamp(args.get("valid_at"), f"{p}valid_at"),
        source_session_id=optional_str(args, "source_session_id", label=f"{p}source_session_id"),
        source_run_id=optional_str(args, "source_run_id", label=f"{p}source_run_id"),
        provenance=stamp_provenance(args.get("provenance"), writer, f"{p}provenance"),
        memory_class=optional_str(args, "memory_class", label=f"{p}memory_class"),
        space=optional_str(args, "space", label=f"{p}space"),
        writer_agent_id=optional_str(args, "writer_agent_id", label=f"{p}writer_agent_id"),
        source_uris=json_text(args.get("source_uris"), f"{p}source_uris"),
        mentions=json_text(args.get("mentions"), f"{p}mentions"),
        dedupe_key=dedupe_key(realm, memory_type, content),
        references=parse_id_list(args.get("references"), f"{p}references"),
        coerced=coerced,
    )


def checked_content(content: str, sent: object, label: str = "content") -> str:
    """A memory's (redacted) text, refused when nothing is left of it or it is too long;
    ``sent`` is the text as given, to say which."""
    if not content.replace(REDACTED, "").strip():
        raise ValidationError(label, "is empty" if not isinstance(sent, str) or (
            not sent.strip()) else "is empty after removing <private> sections")
    if len(content) > MAX_CONTENT_CHARS:
        raise ValidationError(label, f"must be at most {MAX_CONTENT_CHARS} characters")
    return content


EDIT_FIELDS = ("content", "title", "tags", "importance")


def build_edit(raw: object) -> tuple[dict[str, object], dict[str, str]]:
    """An edit's changes (``store.memories.edit``): the fields of ``EDIT_FIELDS`` it names, redacted and
    checked as a save's (a title of null clears it); and what was coerced, as a save says."""
    if not isinstance(raw, Mapping):
        raise ValidationError("body", "must be a JSON object")
    if unknown := sorted(set(raw) - set(EDIT_FIELDS)):
        raise ValidationError(str(unknown[0]), "cannot be edited; an edit changes "
                              f"{', '.join(EDIT_FIELDS)}")
    args = strip_json_object(raw)
    changes: dict[str, object] = {}
    coerced: dict[str, str] = {}
    if "content" in args:
        if not isinstance(content := args["content"], str):
            raise ValidationError("content", "must be a string")
        changes["content"] = checked_content(content, raw.get("content"))
        changes["content_preview"] = preview(content)
    if "title" in args:
        changes["title"] = optional_str(args, "title", limit=MAX_TITLE_CHARS)
    if "tags" in args:
        changes["tags"] = parse_tags(args["tags"])
    if "importance" in args:
        changes["importance"] = parse_importance(args["importance"], "importance", coerced)
    if not changes:
        raise ValidationError("body", f"names nothing to change: {', '.join(EDIT_FIELDS)}")
    return changes, coerced


def entity_content(name: str, kind: str | None, properties: Mapping[str, object],
                   type_: str | None, icon: str | None) -> str:
    """The plane's entity body: name, Kind, properties (strings raw, others JSON), type, icon."""
    lines = [name]
    if kind:
        lines.append(f"Kind: {kind}")
    for key, value in properties.items():
        if value is None or value == "":
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(f"{key}: {text}")
    if type_:
        lines.append(f"type: {type_}")
    if icon:
        lines.append(f"icon: {icon}")
    return "\n".join(lines)
