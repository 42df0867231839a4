"""protocol.rows: the plane's row and body shapes, decoded leniently and encoded exactly."""

import msgspec
import pytest

from protocol.rows import (
    EDGE_COLUMNS,
    NODE_EXPORT_COLUMNS,
    NODE_LATE_COLUMNS,
    ChangesResponse,
    EdgeRow,
    ExportBody,
    ImportRequest,
    ImportResult,
    NodeRow,
    RowError,
    changes_decoder,
    edge_id,
    export_decoder,
    import_request_decoder,
    import_result_decoder,
    json_encoder,
    node_row_decoder,
)

# The contract's §2.2 example, with a short embedding in place of the elided 384 floats.
PLANE_NODE = b"""{
  "id": "memory:00000000-0000-0000-0000-000000000000",
  "labels": "Memory",
  "realm": "default",
  "memory_type": "decision",
  "title": null,
  "content": "hello world",
  "content_preview": "hello world",
  "tags": "a,b",
  "importance": 0.5,
  "status": "active",
  "source_session_id": null,
  "source_run_id": null,
  "embedding": [0.5, 0.25, 0.125],
  "created_at": "2026-05-31T00:00:00Z",
  "updated_at": "2026-05-31T00:00:00Z",
  "valid_at": "2026-05-31T00:00:00Z",
  "invalid_at": null,
  "superseded_by": null,
  "provenance": "{\\"writer\\":{\\"host\\":\\"h\\",\\"source\\":\\"server\\",\\"client\\":null,\\"client_version\\":null}}",
  "topic_key": null,
  "memory_class": "semantic",
  "space": null,
  "writer_agent_id": null
}"""

PLANE_EDGE = (
    b'{"id":"memory:1->default::repo:x:REFERENCES","src":"memory:1","dst":"default::repo:x",'
    b'"type":"REFERENCES","realm":"default","props":"{\\"verdict\\":\\"conflicts\\",\\"reason\\":null}",'
    b'"created_at":"2026-06-01T12:34:56.123456789+00:00"}'
)


def test_column_lists_match_the_struct() -> None:
    fields = NodeRow.__struct_fields__
    assert len(NODE_EXPORT_COLUMNS) == 20
    assert fields[:23] == NODE_EXPORT_COLUMNS + NODE_LATE_COLUMNS
    assert fields[23:] == ("origin", "deleted", "base")
    assert EdgeRow.__struct_fields__[:8] == EDGE_COLUMNS


def test_decode_plane_node_row() -> None:
    row = node_row_decoder.decode(PLANE_NODE)
    assert row.id == "memory:00000000-0000-0000-0000-000000000000"
    assert row.tags == "a,b"
    assert row.importance == 0.5
    assert row.embedding == [0.5, 0.25, 0.125]
    assert row.title is None
    assert row.memory_class == "semantic"
    assert msgspec.json.decode(row.provenance or "")["writer"]["source"] == "server"
    assert row.origin is None and row.deleted is None


def test_decode_ignores_unknown_keys() -> None:
    row = node_row_decoder.decode(b'{"id":"memory:1","future_col":{"x":[1]},"precedent":null}')
    assert row == NodeRow(id="memory:1")


def test_missing_keys_are_none() -> None:
    row = node_row_decoder.decode(b'{"id":"memory:1","content":"c"}')
    assert row.updated_at is None
    assert row.embedding is None
    assert node_row_decoder.decode(b"{}") == NodeRow()


def test_importance_accepts_ints() -> None:
    row = node_row_decoder.decode(b'{"importance":1}')
    assert row.importance == 1.0
    assert isinstance(row.importance, float)


def test_encode_omits_none_fields() -> None:
    row = NodeRow(id="memory:1", content="c", importance=0.5, embedding=[0.5], deleted=False)
    assert json_encoder.encode(row) == (
        b'{"id":"memory:1","content":"c","importance":0.5,"embedding":[0.5],"deleted":false}'
    )
    assert json_encoder.encode(NodeRow()) == b"{}"


def test_plane_node_round_trip_drops_only_nulls() -> None:
    row = node_row_decoder.decode(PLANE_NODE)
    source = msgspec.json.decode(PLANE_NODE)
    expected = {k: v for k, v in source.items() if v is not None}
    assert msgspec.json.decode(json_encoder.encode(row)) == expected
    assert node_row_decoder.decode(json_encoder.encode(row)) == row


def test_tags_as_array_names_the_path() -> None:
    body = b'{"memory_nodes":[{"id":"memory:1","tags":["a","b"]}]}'
    with pytest.raises(msgspec.ValidationError, match=r"\$\.memory_nodes\[0\]\.tags"):
        import_request_decoder.decode(body)


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (b'{"memory_nodes":[{"provenance":{"writer":{}}}]}', r"\$\.memory_nodes\[0\]\.provenance"),
        (b'{"memory_edges":[{},{"props":{"deleted":true}}]}', r"\$\.memory_edges\[1\]\.props"),
        (b'{"memory_nodes":[{"importance":"high"}]}', r"\$\.memory_nodes\[0\]\.importance"),
        (b'{"memory_nodes":[{"id":7}]}', r"\$\.memory_nodes\[0\]\.id"),
    ],
)
def test_wrong_types_name_the_path(body: bytes, path: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=path):
        import_request_decoder.decode(body)


def test_edge_row_and_id() -> None:
    body = b'{"memory_nodes":[],"memory_edges":[' + PLANE_EDGE + b"]}"
    edge = import_request_decoder.decode(body).memory_edges[0]
    assert edge.id == edge_id("memory:1", "default::repo:x", "REFERENCES")
    assert edge.target_namespace is None
    assert edge.updated_at is None
    assert msgspec.json.decode(json_encoder.encode(edge)) == msgspec.json.decode(PLANE_EDGE)


def test_export_round_trip() -> None:
    body = ExportBody(
        memory_nodes=[node_row_decoder.decode(PLANE_NODE)],
        memory_edges=[EdgeRow(id="a->b:T", src="a", dst="b", type="T")],
        hint="Re-import on another instance",
    )
    assert export_decoder.decode(json_encoder.encode(body)) == body


def test_export_always_encodes_both_arrays() -> None:
    assert json_encoder.encode(ExportBody()) == b'{"memory_nodes":[],"memory_edges":[]}'
    assert export_decoder.decode(b"{}") == ExportBody()
    extended = ExportBody(store_id="s1", has_more=True, next_cursor="c")
    assert json_encoder.encode(extended) == (
        b'{"memory_nodes":[],"memory_edges":[],"store_id":"s1","has_more":true,"next_cursor":"c"}'
    )


def test_changes_keeps_since_until_verbatim_and_tolerates_missing_arrays() -> None:
    body = b'{"since":"1970-01-01T00:00:00Z","until":"2026-06-01T12:34:56.123+00:00"}'
    changes = changes_decoder.decode(body)
    assert changes == ChangesResponse(
        since="1970-01-01T00:00:00Z", until="2026-06-01T12:34:56.123+00:00"
    )
    assert json_encoder.encode(changes) == (
        b'{"since":"1970-01-01T00:00:00Z","until":"2026-06-01T12:34:56.123+00:00",'
        b'"memory_nodes":[],"memory_edges":[]}'
    )


def test_changes_requires_since_and_until() -> None:
    with pytest.raises(msgspec.ValidationError, match="until"):
        changes_decoder.decode(b'{"since":"x","memory_nodes":[]}')


def test_changes_round_trip() -> None:
    changes = ChangesResponse(
        since="a",
        until="b",
        memory_nodes=[NodeRow(id="memory:1", deleted=True, origin="r1")],
        store_id="s",
        has_more=False,
    )
    assert changes_decoder.decode(json_encoder.encode(changes)) == changes


def test_import_request() -> None:
    assert import_request_decoder.decode(b"{}") == ImportRequest()
    assert json_encoder.encode(ImportRequest()) == b'{"memory_nodes":[],"memory_edges":[]}'
    request = ImportRequest(memory_nodes=[node_row_decoder.decode(PLANE_NODE)])
    assert import_request_decoder.decode(json_encoder.encode(request)) == request


def test_import_result_matches_the_plane() -> None:
    ok = ImportResult(applied_nodes=2, applied_edges=0, errors=[])
    assert json_encoder.encode(ok) == b'{"applied_nodes":2,"applied_edges":0,"errors":[]}'
    assert (
        json_encoder.encode(ImportResult()) == b'{"applied_nodes":0,"applied_edges":0,"errors":[]}'
    )
    plane_odd = import_result_decoder.decode(b'{"error":"embedding backend: down"}')
    assert plane_odd == ImportResult(error="embedding backend: down")


def test_import_result_row_errors_round_trip() -> None:
    result = ImportResult(
        errors=["nodes: 1 row refused"],
        row_errors=[RowError(kind="node", index=0, field="embedding", message="length 3")],
    )
    encoded = json_encoder.encode(result)
    assert b'"id":null' in encoded  # RowError keeps explicit nulls: one stable shape
    assert import_result_decoder.decode(encoded) == result
