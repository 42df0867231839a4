"""Tests for the ``<private>`` redaction choke point (privacy requirements P1–P4)."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_store.redact import (
    REDACTED,
    contains_private_marker,
    strip_json_strings,
    strip_private,
)

# ---------------------------------------------------------------------------
# Table: (id, input, expected output)
# ---------------------------------------------------------------------------

CASES: list[tuple[str, str, str]] = [
    # Rule 8 fast path / plain text.
    ("empty", "", ""),
    ("plain", "plain text", "plain text"),
    ("comparison-signs", "5 < 6 and 7 > 3", "5 < 6 and 7 > 3"),
    ("already-redacted", "[redacted] already", "[redacted] already"),
    # Rules 1, 10: replacement keeps the surroundings unchanged.
    ("token", "token is <private>sk-abc123</private> ok", "token is [redacted] ok"),
    ("whole-field", "<private>x</private>", "[redacted]"),
    ("empty-span", "<private></private>", "[redacted]"),
    ("no-spaces-around", "a<private>b</private>c<private>d</private>e", "a[redacted]c[redacted]e"),
    ("adjacent-spans", "<private>a</private><private>b</private>", "[redacted][redacted]"),
    # Rule 2: opener forms.
    ("opener-space", "a <private >x</private> b", "a [redacted] b"),
    ("opener-attr-upper", 'a <PRIVATE reason="x">y</PRIVATE> b', "a [redacted] b"),
    ("opener-newline", "a <private\n>y</private> b", "a [redacted] b"),
    ("opener-tab-attr", "a <private\treason=x>y</private> b", "a [redacted] b"),
    ("opener-nbsp", "x <private\u00a0reason>y</private> z", "x [redacted] z"),
    ("mixed-case", "a <Private>y</pRiVaTe> b", "a [redacted] b"),
    ("turkish-i", "<PR\u0130VATE>x</private> y", "[redacted] y"),
    ("attr-swallows-closer", '<private a="</private>">tail', "[redacted]"),
    # Rule 2: things that are not openers.
    ("privately", "<privately>x</privately>", "<privately>x</privately>"),
    ("private-dash", "<private-x>y", "<private-x>y"),
    ("privatefoo", "<privatefoo>y</privatefoo>", "<privatefoo>y</privatefoo>"),
    ("html-escaped", "&lt;private&gt;x&lt;/private&gt;", "&lt;private&gt;x&lt;/private&gt;"),
    ("self-closing-slash", "<private/>x", "<private/>x"),
    # Rule 2: opener without its ">" runs to the end (fail closed).
    ("unterminated-attr", 'safe <private reason="x', "safe [redacted]"),
    ("bare-opener-at-end", "safe <private", "safe [redacted]"),
    ("opener-space-at-end", "safe <private ", "safe [redacted]"),
    ("unterminated-long", "a <private " + "z" * 50, "a [redacted]"),
    # Rule 3: closer forms.
    ("closer-space", "a <private>x</PRIVATE > b", "a [redacted] b"),
    ("closer-newline", "<private>x</private\n>y", "[redacted]y"),
    ("closer-with-attr-not-closer", "<private>a</private x>b", "[redacted]"),
    ("closer-typo-not-closer", "<private>a</privatex>b</private>c", "[redacted]c"),
    ("closer-attr-outside", "</private x>", "</private x>"),
    ("incomplete-closer-outside", "a</private", "a</private"),
    # Rule 4: nesting.
    ("nested", "a <private>x <private>y</private> z</private> b", "a [redacted] b"),
    ("nested-deep", "<private><private><private>x</private></private></private>!", "[redacted]!"),
    # Rule 5: unclosed.
    ("unclosed", "safe <PRIVATE>secret tail", "safe [redacted]"),
    ("unclosed-outer", "a <private>x <private>y</private> z", "a [redacted]"),
    ("lone-opener", "<private>", "[redacted]"),
    # Rule 6: stray closer.
    ("stray", "secret</private> ok", "[redacted] ok"),
    ("lone-closer", "</private>", "[redacted]"),
    ("stray-after-span", "a <private>x</private> b </private> c", "[redacted] c"),
    ("two-strays", "x</private>y</private>z", "[redacted]z"),
    (
        "stray-then-span",
        "secret</PRIVATE > ok <private>p</private> end",
        "[redacted] ok [redacted] end",
    ),
    # Rule 7: joins around [redacted] never form a tag.
    ("join-priv-ate", "<priv<private>x</private>ate>", "<priv[redacted]ate>"),
    ("join-opener-prefix", "<private<private>x</private>", "<private[redacted]"),
    ("join-lt-gt", "<<private>x</private>>", "<[redacted]>"),
    ("join-closer-prefix", "</<private>x</private>private>", "</[redacted]private>"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_table(text: str, expected: str) -> None:
    out = strip_private(text)
    assert out == expected
    assert strip_private(out) == out
    assert not contains_private_marker(out)


def test_redacted_literal() -> None:
    assert REDACTED == "[redacted]"


def test_plain_text_is_returned_as_is() -> None:
    text = "no angle brackets here " * 10
    assert strip_private(text) is text


# ---------------------------------------------------------------------------
# contains_private_marker
# ---------------------------------------------------------------------------

MARKER_CASES: list[tuple[str, bool]] = [
    ("", False),
    ("no tags", False),
    ("&lt;private&gt;", False),
    ("<privately>", False),
    ("<private-x>", False),
    ("[redacted]", False),
    ("</private>", False),
    ("x <Private y", True),
    ("<private>", True),
    ("<PRIVATE\n>", True),
    ("ends with <private", True),
    ('<private reason="x', True),
]


@pytest.mark.parametrize(("text", "expected"), MARKER_CASES)
def test_contains_private_marker(text: str, expected: bool) -> None:
    assert contains_private_marker(text) is expected


# ---------------------------------------------------------------------------
# An independent, deliberately naive reference scanner (quadratic, char by char)
# used as an oracle for the property tests.
# ---------------------------------------------------------------------------


def _word_at(text: str, i: int, word: str) -> bool:
    chunk = text[i : i + len(word)]
    return len(chunk) == len(word) and chunk.lower() == word


def _opener_end(text: str, i: int) -> int | None:
    """End of an opener starting at i (len(text) if it runs to the end), else None."""
    if not (text.startswith("<", i) and _word_at(text, i + 1, "private")):
        return None
    j = i + 8
    if j == len(text):
        return j
    if text[j] == ">":
        return j + 1
    if text[j].isspace():
        k = text.find(">", j)
        return len(text) if k < 0 else k + 1
    return None


def _closer_end(text: str, i: int) -> int | None:
    if not (text.startswith("</", i) and _word_at(text, i + 2, "private")):
        return None
    j = i + 9
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == ">":
        return j + 1
    return None


def reference_strip(text: str) -> str:
    out = ""
    depth = 0
    i = 0
    while i < len(text):
        end = _opener_end(text, i)
        if end is not None:
            depth += 1
            i = end
            continue
        end = _closer_end(text, i)
        if end is not None:
            if depth == 0:
                out = REDACTED
            else:
                depth -= 1
                if depth == 0:
                    out += REDACTED
            i = end
            continue
        if depth == 0:
            out += text[i]
        i += 1
    if depth > 0:
        out += REDACTED
    return out


_CLOSER_ORACLE = re.compile(r"</private\s*>", re.IGNORECASE)


def has_closer(text: str) -> bool:
    return any(_closer_end(text, i) is not None for i in range(len(text)))


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES if c[0] != "turkish-i"])
def test_reference_agrees_with_table(text: str, expected: str) -> None:
    assert reference_strip(text) == expected


# ---------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------

ALPHABET = "<>/privatePRIVATEx \n\t=\"'"
FRAGMENTS = [
    "<private>",
    "</private>",
    "<PRIVATE ",
    "<private",
    "</private",
    "</PRIVATE >",
    '<Private reason="x">',
    "<private\n>",
    "private",
    "priv",
    "ate",
    "<",
    "</",
    ">",
    "/",
    " ",
    "x",
    "[redacted]",
    "&lt;private&gt;",
    "<privately>",
]

rich_text = st.one_of(
    st.text(alphabet=ALPHABET, max_size=60),
    st.lists(
        st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=ALPHABET, max_size=4)),
        max_size=20,
    ).map("".join),
)


@settings(max_examples=1000)
@given(rich_text)
def test_idempotent(text: str) -> None:
    once = strip_private(text)
    assert strip_private(once) == once


@settings(max_examples=1000)
@given(rich_text)
def test_output_has_no_tags(text: str) -> None:
    out = strip_private(text)
    assert not contains_private_marker(out)
    assert _CLOSER_ORACLE.search(out) is None
    assert not has_closer(out)
    assert all(_opener_end(out, i) is None for i in range(len(out)))


@settings(max_examples=1000)
@given(rich_text)
def test_matches_reference(text: str) -> None:
    assert strip_private(text) == reference_strip(text)


@given(rich_text)
def test_tag_free_text_is_unchanged(text: str) -> None:
    if not contains_private_marker(text) and not has_closer(text):
        assert strip_private(text) == text


WRAPPERS: list[Callable[[str], str]] = [
    lambda c: f"<private>{c}</private>",
    lambda c: f'<PRIVATE reason="why">{c}</PRIVATE >',
    lambda c: f"<private\n>{c}</private\n>",
    lambda c: f"<Private>{c}",  # unclosed
    lambda c: f"<private>a<private>{c}</private>b</private>",  # nested
    lambda c: f"<private>a<PRIVATE>{c}</private>b",  # nested, outer unclosed
    lambda c: f"{c}</private>",  # stray closer
    lambda c: f"{c}</PRIVATE\t>",  # stray closer, whitespace
    lambda c: f'<private reason="{c}',  # inside an unterminated opener
    lambda c: f'<private data="{c}">z</private>',  # inside the opener's attributes
    lambda c: f"<private>{c}</private",  # closer missing its ">"
    lambda c: f"<private>{c}</private x>",  # not-a-closer after the canary
]

canaries = st.text(alphabet="0123456789abcdef", min_size=8, max_size=16).map(lambda h: "CANARY" + h)


@settings(max_examples=1000)
@given(
    st.lists(
        st.tuples(rich_text, st.integers(0, len(WRAPPERS) - 1), canaries),
        min_size=1,
        max_size=4,
    ),
    rich_text,
)
def test_canary_never_survives(parts: list[tuple[str, int, str]], tail: str) -> None:
    text = "".join(prefix + WRAPPERS[w](canary) for prefix, w, canary in parts) + tail
    out = strip_private(text)
    assert "CANARY" not in out
    for _, _, canary in parts:
        assert canary not in out
        assert canary[6:] not in out


# ---------------------------------------------------------------------------
# Rule 8: linear time on adversarial 1 MiB-ish inputs
# ---------------------------------------------------------------------------

ADVERSARIAL: list[tuple[str, str]] = [
    ("openers-no-gt", "<private" * 100_000),
    ("openers-space", "<private " * 100_000),
    ("openers-complete", "<private>" * 100_000),
    ("closers", "</private>" * 100_000),
    ("lt-only", "<" * 1_000_000),
    ("open-then-1M", "<private " + "a" * 1_000_000),
    ("closer-prefix-whitespace", ("</private" + " " * 1_000) * 1_000),
    ("near-openers", "<privatex" * 110_000),
    ("partial-closers", "</p" * 350_000),
    ("deep-nesting", "<private>" * 60_000 + "</private>" * 60_000),
    ("pairs", "<private></private>" * 60_000),
    ("no-lt", "a" * 1_048_576),
]


@pytest.mark.parametrize("text", [a[1] for a in ADVERSARIAL], ids=[a[0] for a in ADVERSARIAL])
def test_adversarial_inputs_are_linear(text: str) -> None:
    start = time.perf_counter()
    out = strip_private(text)
    marker = contains_private_marker(out)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"took {elapsed:.3f}s"
    assert not marker


def test_adversarial_results() -> None:
    assert strip_private("<private" * 100_000) == "<private" * 99_999 + REDACTED
    assert strip_private("</private>" * 100_000) == REDACTED
    assert strip_private("<private " + "a" * 1_000_000) == REDACTED
    assert strip_private("<private>" * 100_000) == REDACTED
    assert strip_private("<" * 1_000) == "<" * 1_000


# ---------------------------------------------------------------------------
# strip_json_strings
# ---------------------------------------------------------------------------


def test_strip_json_strings_nested() -> None:
    value = {
        "note": "a <private>k</private> b",
        "<private>secret-key</private>": {
            "list": ["<PRIVATE>x", 1, 2.5, None, True, {"k</private>": "v"}],
        },
        "n": 3,
        7: "int key <private reason=x>y</private>",
    }
    original = copy.deepcopy(value)
    out = strip_json_strings(value)
    assert out == {
        "note": "a [redacted] b",
        "[redacted]": {"list": ["[redacted]", 1, 2.5, None, True, {"[redacted]": "v"}]},
        "n": 3,
        7: "int key [redacted]",
    }
    assert value == original  # input untouched
    assert isinstance(out, dict)
    assert out is not value
    assert "secret" not in json.dumps(out)


def test_strip_json_strings_returns_new_containers() -> None:
    inner = ["plain"]
    value = {"k": inner}
    out = strip_json_strings(value)
    assert out == value
    assert out is not value
    assert isinstance(out, dict)
    assert out["k"] is not inner


@pytest.mark.parametrize("scalar", [0, 1.5, None, True, False, b"<private>x</private>"])
def test_strip_json_strings_scalars_unchanged(scalar: object) -> None:
    assert strip_json_strings(scalar) is scalar


def test_strip_json_strings_top_level_string_and_tuple() -> None:
    assert strip_json_strings("<private>x</private>!") == "[redacted]!"
    assert strip_json_strings(("a<private>x", 2)) == ("a[redacted]", 2)


def test_strip_json_strings_key_collision_last_wins() -> None:
    out = strip_json_strings({"<private>a</private>": 1, "<private>b</private>": 2})
    assert out == {"[redacted]": 2}


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), rich_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(rich_text, children, max_size=4),
    ),
    max_leaves=20,
)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


@given(json_values, canaries)
def test_strip_json_strings_property(value: object, canary: str) -> None:
    wrapped = {f"<private>{canary}</private>": [value, f"x <PRIVATE>{canary}"]}
    out = strip_json_strings(wrapped)
    for s in _strings(out):
        assert not contains_private_marker(s)
        assert _CLOSER_ORACLE.search(s) is None
        assert canary not in s
    assert strip_json_strings(out) == out
