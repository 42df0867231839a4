"""``POST /v1/agent/memory/query`` request and response (contract §4.1, §6).

Rules:
1. The request decodes the way the plane's serde does: only ``query`` is required; the other
   fields have the plane's defaults, and unknown fields are ignored. ``limit`` and
   ``expand_hops`` are unsigned in the plane (usize, u8), so out-of-range values are
   validation errors (the plane answers 422).
2. ``RetrievedMemory``, ``Via`` and ``Linked`` encode None as an explicit ``null`` (serde),
   unlike the export rows. syncd's extensions on them are always present too.
3. ``QueryResponse`` always carries ``memories``, ``linked``, ``context`` and ``took_ms``.
   ``brief`` and syncd's extensions are omitted when None, as the plane omits ``brief``.
   ``precedent`` is the current plane's worked-example block (``PrecedentBlock``,
   ``memory_retrieve.rs``), which the plane always sends, ``null`` when none was found. syncd
   finds none: an answer built with ``precedent=None`` sends ``null`` (the hub's answers and
   the MCP search tools'), one built without it (``UNSET``) leaves the key out (the daemon's
   REST answer, as before); a plane's block decodes.
4. ``RetrievedMemory.realm`` is always a string, as the plane's (``String``; a row without one
   gives ``""``): a ``None`` given to the constructor becomes ``""``. The annotation still
   admits ``None`` because the local store builds answers from optional columns.
"""

from typing import Annotated

import msgspec

Unsigned = Annotated[int, msgspec.Meta(ge=0)]
U8 = Annotated[int, msgspec.Meta(ge=0, le=255)]


class QueryRequest(msgspec.Struct, kw_only=True):
    query: str
    realms: list[str] = []  # [] = all realms; "global" is never added implicitly
    memory_type: str | None = None
    tags: list[str] = []
    importance_min: float | None = None
    as_of: str | None = None
    include_invalidated: bool = False
    limit: Unsigned | None = None  # None = settings.default_limit; clamped to [1, 100]
    expand_hops: U8 | None = None  # None = settings.default_expand_hops; min(., 2)
    space_agent: str | None = None
    mode: str | None = None  # "agentic" adds brief; anything else is "fast"
    confident_only: bool = False  # syncd: only memories it is confident answer the query


class Via(msgspec.Struct, kw_only=True):
    """How a graph-pulled memory was reached."""

    seed: str
    type: str
    depth: int


class Linked(msgspec.Struct, kw_only=True):
    """A non-memory endpoint reached by graph expansion."""

    node_id: str
    target_namespace: str | None
    edge_type: str
    depth: int


class ScoreComponents(msgspec.Struct, kw_only=True):
    """syncd: the unweighted terms of the final score, for explaining a ranking."""

    rrf: float
    semantic: float
    keyword: float
    graph: float
    importance: float
    recency: float
    penalty: float = 0.0


class Precedent(msgspec.Struct, kw_only=True):
    """The plane's worked-example precedent: a past input close to the query and the memories
    it produced."""

    activity_id: str
    activity_preview: str
    activity_created_at: str | None
    similarity: float  # 1 - distance, higher is closer
    memory_ids: list[str]


class RetrievedMemory(msgspec.Struct, kw_only=True):
    id: str
    memory_type: str
    title: str | None
    content_preview: str
    score: float
    distance: float | None
    kw_score: float | None
    graph_proximity: float
    importance: float
    realm: str | None
    valid_at: str | None
    invalid_at: str | None
    via: Via | None
    components: ScoreComponents | None = None  # syncd
    fallback: bool = False  # syncd
    confident: bool = False  # syncd: evidence of its own that it answers the query
    superseded_by: str | None = None  # syncd

    def __post_init__(self) -> None:
        if self.realm is None:
            self.realm = ""


class QueryResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    memories: list[RetrievedMemory]
    linked: list[Linked]
    context: str
    took_ms: int
    precedent: Precedent | msgspec.UnsetType | None = msgspec.UNSET
    brief: str | None = None
    gated: list[str] | None = None  # syncd
    gate_reason: str | None = None  # syncd
    fallback: bool | None = None  # syncd
    matched: bool | None = None  # syncd: some memory answers the query with confidence


json_encoder = msgspec.json.Encoder()
query_request_decoder = msgspec.json.Decoder(QueryRequest)
query_response_decoder = msgspec.json.Decoder(QueryResponse)
