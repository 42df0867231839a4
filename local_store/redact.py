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

__all__ = ["REDACTED", "contains_private_marker", "strip_json_strings", "strip_private"]

REDACTED = "[redacted]"

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


def contains_private_marker(text: str) -> bool:
    """True if ``text`` still holds a ``<private`` that would open a tag.

    Meant as an egress assertion after :func:`strip_private`; an opener whose
    ``>`` is missing (or a bare ``<private`` at the end) counts.
    """
    if "<" not in text:
        return False
    return _OPENER.search(text) is not None


def strip_json_strings(value: object) -> object:
    """Apply :func:`strip_private` to every string in a JSON-like structure.

    Dict keys and values, list and tuple items are visited recursively and a new
    structure is returned (dicts become plain ``dict``, lists ``list``, tuples
    ``tuple``); non-string scalars are returned unchanged. If two keys redact to
    the same string, the later one wins, as with duplicate keys in JSON.
    """
    if isinstance(value, str):
        return strip_private(value)
    if isinstance(value, dict):
        return {
            (strip_private(k) if isinstance(k, str) else k): strip_json_strings(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [strip_json_strings(item) for item in value]
    if isinstance(value, tuple):
        return tuple(strip_json_strings(item) for item in value)
    return value


def strip_private_json_text(text: str) -> str:
    """Redact a field that holds JSON text (provenance, props, source_uris, mentions).

    The raw text is scanned first; then, if it may hide a tag behind JSON escapes (any
    backslash: ``\\u003cprivate>``, ``<\\u0070rivate>``, ``<\\/private>`` all decode to a
    tag), it is decoded, every string inside is scanned, and it is re-encoded only when
    something changed. Text that is not JSON keeps its literal escapes, which are not tags.
    """
    out = strip_private(text) if "<" in text else text
    if "\\" not in out:
        return out
    try:
        parsed = json.loads(out)
    except ValueError:
        return out
    cleaned = strip_json_strings(parsed)
    if cleaned == parsed:
        return out
    return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))
