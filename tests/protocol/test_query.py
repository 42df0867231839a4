"""protocol.query: request defaults and the response's explicit-null shape."""

import msgspec
import pytest

from protocol.query import (
    Linked,
    QueryRequest,
    QueryResponse,
    RetrievedMemory,
    ScoreComponents,
    Via,
    json_encoder,
    query_request_decoder,
    query_response_decoder,
)


def test_minimal_request_defaults() -> None:
    request = query_request_decoder.decode(b'{"query":"x"}')
    assert request == QueryRequest(query="x")
    assert request.realms == []
    assert request.tags == []
    assert request.memory_type is None
    assert request.importance_min is None
    assert request.as_of is None
    assert request.include_invalidated is False
    assert request.limit is None
    assert request.expand_hops is None
    assert request.space_agent is None
    assert request.mode is None


def test_full_request_and_unknown_fields() -> None:
    body = (
        b'{"query":"q","realms":["p","global"],"memory_type":"fact","tags":["a"],'
        b'"importance_min":1,"as_of":"2026-01-01T00:00:00Z","include_invalidated":true,'
        b'"limit":3,"expand_hops":2,"space_agent":"claude","mode":"agentic","new_knob":1}'
    )
    request = query_request_decoder.decode(body)
    assert request.realms == ["p", "global"]
    assert request.importance_min == 1.0
    assert request.limit == 3
    assert request.mode == "agentic"


def test_missing_query_is_a_validation_error() -> None:
    with pytest.raises(msgspec.ValidationError, match="query"):
        query_request_decoder.decode(b'{"realms":[]}')


@pytest.mark.parametrize(
    ("body", "field"),
    [(b'{"query":"q","limit":-1}', "limit"), (b'{"query":"q","expand_hops":256}', "expand_hops")],
)
def test_unsigned_fields_reject_out_of_range(body: bytes, field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        query_request_decoder.decode(body)


def _memory(**overrides: object) -> RetrievedMemory:
    fields: dict[str, object] = {
        "id": "memory:1",
        "memory_type": "fact",
        "title": None,
        "content_preview": "p",
        "score": 1.5,
        "distance": None,
        "kw_score": 2.0,
        "graph_proximity": 0.0,
        "importance": 0.5,
        "realm": "proj",
        "valid_at": None,
        "invalid_at": None,
        "via": None,
    }
    fields.update(overrides)
    return msgspec.convert(fields, RetrievedMemory)


def test_response_has_explicit_nulls_and_omits_brief() -> None:
    response = QueryResponse(
        memories=[_memory()],
        linked=[
            Linked(
                node_id="default::repo:x", target_namespace=None, edge_type="REFERENCES", depth=1
            )
        ],
        context="",
        took_ms=3,
    )
    assert json_encoder.encode(response) == (
        b'{"memories":[{"id":"memory:1","memory_type":"fact","title":null,"content_preview":"p",'
        b'"score":1.5,"distance":null,"kw_score":2.0,"graph_proximity":0.0,"importance":0.5,'
        b'"realm":"proj","valid_at":null,"invalid_at":null,"via":null,"components":null,'
        b'"fallback":false,"confident":false,"superseded_by":null}],'
        b'"linked":[{"node_id":"default::repo:x","target_namespace":null,"edge_type":"REFERENCES",'
        b'"depth":1}],"context":"","took_ms":3}'
    )


def test_empty_response_keeps_required_keys() -> None:
    empty = QueryResponse(memories=[], linked=[], context="", took_ms=0)
    assert json_encoder.encode(empty) == b'{"memories":[],"linked":[],"context":"","took_ms":0}'


def test_response_round_trip_with_extensions() -> None:
    memory = _memory(
        via={"seed": "memory:0", "type": "RELATES_TO", "depth": 1},
        components={
            "rrf": 0.016,
            "semantic": 0.8,
            "keyword": 0.5,
            "graph": 0.5,
            "importance": 0.5,
            "recency": 1.0,
        },
        fallback=True,
        confident=True,
    )
    assert memory.via == Via(seed="memory:0", type="RELATES_TO", depth=1)
    assert memory.components == ScoreComponents(
        rrf=0.016, semantic=0.8, keyword=0.5, graph=0.5, importance=0.5, recency=1.0
    )
    response = QueryResponse(
        memories=[memory],
        linked=[],
        context="c",
        took_ms=1,
        brief="b",
        gated=["memory:2"],
        gate_reason="private",
        fallback=True,
        matched=False,
    )
    assert b'"confident":true' in json_encoder.encode(response)
    assert b'"matched":false' in json_encoder.encode(response)
    assert query_response_decoder.decode(json_encoder.encode(response)) == response


def test_plane_response_decodes() -> None:
    body = (
        b'{"memories":[{"id":"memory:1","memory_type":"fact","title":null,"content_preview":"x",'
        b'"score":1.234,"distance":0.21,"kw_score":2.0,"graph_proximity":0.0,"importance":0.5,'
        b'"realm":"proj","valid_at":"2026-01-01T00:00:00+00:00","invalid_at":null,"via":null}],'
        b'"linked":[],"context":"Relevant memories:\\n","took_ms":37,"precedent":null}'
    )
    response = query_response_decoder.decode(body)
    assert response.memories[0].components is None
    assert response.memories[0].fallback is False
    assert response.brief is None
