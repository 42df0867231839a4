"""The single ``<private>`` redaction choke point.

Every piece of text that leaves the local store (search results, exports,
replication payloads) goes through :func:`strip_private`. The rules are:

1. Each private span, tags included, is replaced by the literal ``[redacted]``.
   Text around it is left byte-for-byte unchanged.
2. An *opening tag* is ``<private`` (case-insensitive) followed by ``>``
   directly, or by whitespace and then anything up to the next ``>``
   (``<private >``, ``<PRIVATE reason="x">``, ``<private\\n>``).
   ``<privately>``, ``<private-x>``, ``<privatefoo>`` and the HTML-escaped
   ``&lt;private&gt;`` are not tags and are left alone. An opener whose ``>``
   never comes (the field ends inside ``<private reason="x``), and a bare
   ``<private`` at the very end of the field, open a span that runs to the end
   of the field (fail closed).
3. A *closing tag* is ``</private`` (case-insensitive), optional whitespace,
   then ``>`` (``</private>``, ``</PRIVATE >``).
4. Tags nest: a span runs from its outermost opener to the matching outermost
   closer, counting depth.
5. An opener that is never closed hides everything to the end of the field.
6. A stray closer (one with no open span) hides everything from the start of
   the field up to and including that closer, including any text already
   emitted; scanning then continues normally after it.
7. The result is idempotent and contains no opener or closer: every visible
   piece of the output was tag-free in the input, and each piece is separated
   from the next by ``[redacted]``, whose ``[`` and ``]`` can never be part of
   a tag, so no tag can be formed across a join.
8. The scan is a single left-to-right pass over the tokens found by one
   regular expression with possessive quantifiers (no backtracking blow-up);
   text without ``<`` is returned as is.
9. Nothing from inside a span, nor from inside a tag, reaches the output.

"Case-insensitive" is Python's ``re.IGNORECASE``: besides ASCII case it also
folds the Turkish dotted/dotless i (``İ``, ``ı``) to ``i``, so ``<PRİVATE>`` is
treated as a tag too (the wider match only ever hides more). "Whitespace" is
``\\s`` as Python's ``re`` defines it for ``str`` (Unicode whitespace).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from local_store.errors import ValidationError

__all__ = ["MAX_JSON_DEPTH", "REDACTED", "contains_private_marker", "has_private_tag",
           "holds_lone_surrogate", "is_text", "quoted", "refuse_lone_surrogate",
           "strip_json_object", "strip_json_strings", "strip_private"]

REDACTED = "[redacted]"
MAX_JSON_DEPTH = 64  # nesting of arguments and JSON-text fields; deeper is refused

# One token per match, found leftmost-first:
#   group "open":  "<private" then ">" | whitespace + everything up to ">" or the
#                  end of the field | the end of the field.
#   group "close": "</private" + optional whitespace + ">".
# The possessive quantifiers never give characters back, so each match attempt
# is linear in what it consumes and a failed attempt costs O(1) amortised.
_TOKEN = re.compile(
    r"(?P<open><private(?:>|\s[^>]*+(?:>|\Z)|\Z))|(?P<close></private\s*+>)",
    re.IGNORECASE,
)

# Opener as seen by the egress guard: only the start of the tag matters.
_OPENER = re.compile(r"<private(?:[>\s]|\Z)", re.IGNORECASE)


def strip_private(text: str) -> str:
    """Return ``text`` with every ``<private>`` span replaced by ``[redacted]``."""
    if "<" not in text:
        return text

    pieces: list[str] = []
    depth = 0
    pos = 0  # start of visible text not yet copied to ``pieces``
    for match in _TOKEN.finditer(text):
        if match.lastgroup == "open":
            if depth == 0:
                pieces.append(text[pos : match.start()])
            # An opener without ">" matched up to the end of the field, so no
            # token follows it and the span below runs to the end.
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                pieces.append(REDACTED)
                pos = match.end()
        else:
            # Stray closer: its opener was lost, so everything before it is
            # presumed private.
            pieces = [REDACTED]
            pos = match.end()

    if depth > 0:
        pieces.append(REDACTED)
    else:
        pieces.append(text[pos:])
    return "".join(pieces)


def quoted(value: str, limit: int = 40) -> str:
    """``value`` as an error message may quote it: redacted first (a value the client sent may
    hold a private span), then cut to ``limit`` characters, in quotes."""
    return repr(strip_private(value)[:limit])


def has_private_tag(text: str) -> bool:
    """True if :func:`strip_private` would change ``text``: it holds an opener or a closer,
    by the same rules (and the same case folding) as the redactor's."""
    return "<" in text and _TOKEN.search(text) is not None


def contains_private_marker(text: str) -> bool:
    """True if ``text`` still holds a ``<private`` that would open a tag.

    Meant as an egress assertion after :func:`strip_private`; an opener whose
    ``>`` is missing (or a bare ``<private`` at the end) counts.
    """
    if "<" not in text:
        return False
    return _OPENER.search(text) is not None


def strip_json_strings(value: object, field: str = "body") -> object:
    """Apply :func:`strip_private` to every string in a JSON-like structure.

    Dict keys and values, list and tuple items are visited recursively and a new
    structure is returned (dicts become plain ``dict``, lists ``list``, tuples
    ``tuple``); non-string scalars are returned unchanged. If two keys redact to
    the same string, the later one wins, as with duplicate keys in JSON.

    A structure nested more than ``MAX_JSON_DEPTH`` levels deep raises
    ``ValidationError`` naming the top-level key whose value is too deep (an
    object's keys are its fields: ``field.key``, or ``key`` when ``field`` is
    ``"body"``, the whole of a request's arguments).
    """
    return _strip_json(value, 0, field, top=True)


def strip_json_object(value: Mapping[str, object]) -> dict[str, object]:
    """:func:`strip_json_strings` of a request's arguments (each key a field). Arguments that
    are not an object are refused as ``body``, as ``save`` refuses them: ``dict()`` would make
    ``{}`` of a list and fail on anything else with a TypeError."""
    if not isinstance(value, Mapping):
        raise ValidationError("body", "must be a JSON object")
    clean = strip_json_strings(dict(value))
    assert isinstance(clean, dict)
    return clean


def _strip_json(value: object, depth: int, field: str, *, top: bool = False,
                strict: bool = True) -> object:
    """``strict``: arguments (refused when too deep, or holding a lone surrogate); else JSON
    text already decoded (``strip_private_json_text``): only redacted, as it was accepted
    before it was read."""
    if isinstance(value, str):
        if strict:
            refuse_lone_surrogate(value, field)
        return strip_private(value)
    if not isinstance(value, dict | list | tuple):
        return value
    if strict and depth >= MAX_JSON_DEPTH:
        raise ValidationError(field, f"is nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if strict and isinstance(key, str):
                refuse_lone_surrogate(key, field)
            clean = strip_private(key) if isinstance(key, str) else key
            name = field if not top else str(clean) if field == "body" else f"{field}.{clean}"
            out[clean] = _strip_json(item, depth + 1, name, strict=strict)
        return out
    items = [_strip_json(item, depth + 1, field, strict=strict) for item in value]
    return items if isinstance(value, list) else tuple(items)


def refuse_lone_surrogate(text: str, field: str) -> None:
    """JSON can spell a lone surrogate (``"\\ud800"``), which no UTF-8 text (nor SQLite)
    can hold: refused here, naming the field, rather than failing the write later."""
    if not text.isascii() and not is_text(text):
        raise ValidationError(field, "must be Unicode text: it holds a lone surrogate "
                              "(an unpaired \\ud800-\\udfff escape)")


def strip_private_json_text(text: str, field: str = "body") -> str:
    """Redact a field that holds JSON text (provenance, props, source_uris, mentions).

    One pass (``_json_text_pass``) redacts the raw text, then, if it may hide a tag behind
    JSON escapes (any backslash: ``\\u003cprivate>``, ``<\\u0070rivate>``, ``<\\/private>``
    all decode to a tag), decodes it, redacts every string inside and re-encodes it when
    something changed — or when an object repeats a key: decoding keeps only the last, so an
    earlier one could hide a tag the comparison never sees; the re-encoded text drops it, as
    any JSON reader would. Text that is not JSON keeps its literal escapes, which are not tags.

    Passes repeat until one changes nothing, so the result is a fixed point: a replica that
    redacts a hub's stored text again keeps it as it is (the content hash stays the hub's), and
    a raw pass that turned text which was not JSON into JSON has its escapes read too.
    Nothing else about the text is judged here (any depth, escaped lone surrogates): it is
    refused, naming ``field``, only when too deep for Python to decode at all.
    """
    for _ in range(MAX_JSON_TEXT_PASSES):
        out = _json_text_pass(text, field)
        if out == text:
            return out
        text = out
    raise ValidationError(field, "holds <private> spans that redaction does not settle")


MAX_JSON_TEXT_PASSES = 4  # text that is not JSON, made JSON by a raw pass: 3 passes settle it


def _json_text_pass(text: str, field: str) -> str:
    """One redaction pass of ``strip_private_json_text``. When the raw pass breaks text that
    was JSON (a literal closer in one string hides the structure before it, and an escaped
    span after it would go unread), the strings of the original are redacted instead."""
    if "<" not in text and "\\" not in text:
        return text  # neither a tag nor an escape that could spell one
    out = strip_private(text) if "<" in text else text
    if out != text and _decode(out, field) is None and _decode(text, field) is not None:
        out = text
    elif "\\" not in out:
        return out
    decoded = _decode(out, field)
    if decoded is None:
        return out
    parsed, repeated = decoded
    cleaned = _strip_json(parsed, 0, field, strict=False)
    if cleaned == parsed and not repeated:
        return out
    encoded = json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))
    # a lone surrogate spelled as an escape stays one: no UTF-8 text can hold it raw
    return encoded if encoded.isascii() or is_text(encoded) else json.dumps(
        cleaned, separators=(",", ":"))


def _decode(text: str, field: str) -> tuple[object, bool] | None:
    """``text`` decoded, and whether an object in it repeats a key; None if it is not JSON."""
    repeated = False

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal repeated
        found = dict(items)
        repeated = repeated or len(found) != len(items)
        return found

    try:
        return json.loads(text, object_pairs_hook=pairs), repeated
    except RecursionError:  # deeper than Python's stack: cannot be checked, so not kept
        raise ValidationError(field, "is JSON nested too deeply to check") from None
    except ValueError:
        return None


def holds_lone_surrogate(value: object) -> bool:
    """Whether a decoded JSON value has a string (or key) no UTF-8 text can hold."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not is_text(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def is_text(text: str) -> bool:
    """Whether UTF-8 (and so SQLite) can hold ``text``: no lone surrogate in it."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
