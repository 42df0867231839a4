"""Reading an export file a piece at a time (``syncd/jsonrows.py``) gives exactly what
``json.loads`` gives, whatever the pieces' size, and refuses what is not an export."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.jsonrows import count_rows, rows

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
documents = st.dictionaries(
    st.sampled_from(["memory_nodes", "memory_edges", "hint", "store_id", "x"]),
    st.one_of(st.lists(values, max_size=6), values), max_size=5).filter(
    lambda d: all(isinstance(d.get(k), list | type(None)) for k in ("memory_nodes", "memory_edges")))


def read(text: str, chunk: int) -> list[tuple[str, int, Any]]:
    return list(rows(io.StringIO(text), chunk))


@settings(max_examples=int(os.environ.get("SYNCD_PROPERTY_EXAMPLES", "25")) * 8, deadline=None)
@given(documents, st.sampled_from([None, 0, 2]), st.integers(1, 40), st.booleans())
def test_rows_are_json_loads_rows_in_any_pieces(document: dict[str, Any], indent: int | None,
                                                chunk: int, ascii_only: bool) -> None:
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only)
    expected = [(key, index, row) for key in document if key in ("memory_nodes", "memory_edges")
                for index, row in enumerate(document[key] or [])]
    assert read(text, chunk) == expected
    assert count_rows(io.StringIO(text), chunk) == {
        "memory_nodes": len(document.get("memory_nodes") or []),
        "memory_edges": len(document.get("memory_edges") or [])}


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_a_number_cut_by_a_pieces_end_is_read_whole(chunk: int) -> None:
    text = '{"memory_nodes": [1, 23456, -7.25e-3, 0.0, 1e+30, {"n": 123456789}], "n": 98765}'
    assert [row for _, _, row in read(text, chunk)] == [
        1, 23456, -7.25e-3, 0.0, 1e+30, {"n": 123456789}]


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "expected an object with memory_nodes and memory_edges at character 0, found '['"),
    ("", "expected an object with memory_nodes and memory_edges at character 0, found the end"),
    ('{"memory_nodes": 5}', "memory_nodes must be a list of rows, got int"),
    ('{"memory_edges": {"a": 1}}', "memory_edges must be a list of rows, got object"),
    ('{"memory_nodes": [{"id": "a"}, {"id": ', "the file ends early, at character 38"),
    ('{"memory_nodes": [{"id": "a"}, ', "the file ends early, at character 31"),
    ('{"memory_nodes": [{"id": "a"} {"id": "b"}]}', "expected ',' or ']' at character 30"),
    ('{"memory_nodes": [{"id": "a}]}', "not JSON at character 25: Unterminated string"),
    ('{"memory_nodes": []} {}', "extra data after the object at character 21"),
    ('{"memory_nodes": [], 7: 1}', "expected a key (a string) at character 21"),
    # json's decoder recurses once a level: a RecursionError escaped as a traceback
    ('{"memory_nodes": [' + "[" * 100_000 + "]" * 100_000 + "]}",
     "the value at character 18 is nested too deeply to read"),
    ('{"hint": ' + '{"a": ' * 5_000 + "1" + "}" * 5_000 + "}",
     "the value at character 9 is nested too deeply to read"),
])
def test_what_is_not_an_export_is_refused_where_it_goes_wrong(text: str, message: str) -> None:
    for chunk in (1, 4, 1 << 20):
        with pytest.raises(ValueError) as err:
            count_rows(io.StringIO(text), chunk)
        assert str(err.value).startswith(message), (chunk, str(err.value))
