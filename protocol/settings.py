"""The plane's ``MemorySettings`` (contract §4.5), with its coded defaults.

Rules:
1. Every field has the plane's default, so a partial body decodes (serde ``default``), and
   unknown keys are ignored. Encoding emits every field, as the plane does.
2. The structs are frozen, so the shared ``DEFAULT_SETTINGS`` cannot be changed in place.
   Derive new values with ``merge_patch`` or ``msgspec.structs.replace``.
3. ``merge_patch`` is a JSON merge of the given keys (nested objects merge recursively) on top
   of the current value, validated by ``msgspec.convert``. A wrong type raises
   ``msgspec.ValidationError`` naming the path. Note the plane's own PUT is a full replace,
   not a patch (contract §4.6).
4. ``confidence_threshold`` is an f32 in the plane and may arrive as ``0.6000000238418579``.
5. ``merge_patch`` also refuses a number that is not finite (JSON has none, but Python's
   ``json`` reads ``NaN``; stored, it would come back as ``null`` and no longer decode), an
   ``rrf_k`` that is not above 0 (``1/(rrf_k + rank)`` with rank 0), a count outside
   0..2^64-1 (the plane's counts are u64: its serde refuses them) and a mode outside the
   plane's enums (HITL ``auto|post_hoc|gate``, dreaming ``full|housekeeping_only|sources``).
   Decoding stays lenient about modes: a newer plane may add one. ``load_settings`` reads
   stored settings that an older syncd let such a value into: each field that does not decode
   falls back to its default, so a store still opens.
"""

import math
from typing import Any

import msgspec


class DreamingSettings(msgspec.Struct, kw_only=True, frozen=True):
    enabled: bool = False
    interval_secs: int = 86400
    mode: str = "full"  # full | housekeeping_only | sources
    realm_scope: list[str] = []
    max_tool_calls: int = 100
    wall_clock_secs: int = 3600
    connector_read_budget: int = 25
    connector_read_max_bytes: int = 4194304
    mutation_cap: int = 60


class HitlOps(msgspec.Struct, kw_only=True, frozen=True):
    """HITL mode (auto | post_hoc | gate) per memory operation."""

    add: str = "auto"
    update: str = "post_hoc"
    invalidate: str = "gate"
    merge: str = "gate"
    archive: str = "gate"
    link_entity_cross_realm: str = "gate"
    relationship_write: str = "post_hoc"
    promote_file_candidate: str = "auto"


class HitlSettings(msgspec.Struct, kw_only=True, frozen=True):
    enabled: bool = False
    ops: HitlOps = msgspec.field(default_factory=HitlOps)
    confidence_threshold: float = 0.6
    realm_scope: list[str] = []
    type_scope: list[str] = []


class MemorySettings(msgspec.Struct, kw_only=True, frozen=True):
    extraction_enabled: bool = True
    min_events: int = 1
    default_limit: int = 8
    default_expand_hops: int = 1
    ann_threshold: float = 0.0
    w_rrf: float = 1.0
    w_semantic: float = 0.6
    w_keyword: float = 0.3
    w_graph: float = 0.5
    w_importance: float = 0.4
    w_recency: float = 0.3
    half_life_days: float = 30.0
    rrf_k: float = 60.0
    dreaming: DreamingSettings = msgspec.field(default_factory=DreamingSettings)
    hitl: HitlSettings = msgspec.field(default_factory=HitlSettings)
    w_reinforcement: float = 0.0  # late key
    embedding_model: str | None = None  # syncd: the model the hub's embeddings use


DEFAULT_SETTINGS = MemorySettings()

json_encoder = msgspec.json.Encoder()
settings_decoder = msgspec.json.Decoder(MemorySettings)


def _merge(base: dict[str, Any], patch: dict[str, object]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged


def merge_patch(current: MemorySettings, patch: dict[str, object]) -> MemorySettings:
    """Apply only the keys in ``patch`` to ``current``; raise ``msgspec.ValidationError``
    naming the path on a bad type or value (rule 5)."""
    merged = msgspec.convert(_merge(msgspec.to_builtins(current), patch), MemorySettings)
    _check_numbers(merged, "$")
    if not merged.rrf_k > 0:
        raise msgspec.ValidationError(f"must be above 0, got {merged.rrf_k!r} - at `$.rrf_k`")
    return merged


HITL_MODES = ("auto", "post_hoc", "gate")
DREAMING_MODES = ("full", "housekeeping_only", "sources")
U64_MAX = 2**64 - 1  # the plane's counts are u64


def _check_numbers(value: msgspec.Struct, path: str) -> None:
    """Rule 5, field by field: finite floats, counts in u64's range, modes of the plane's
    enums."""
    for name in value.__struct_fields__:
        field, where = getattr(value, name), f"{path}.{name}"
        if isinstance(field, msgspec.Struct):
            _check_numbers(field, where)
        elif isinstance(field, float) and not math.isfinite(field):
            raise msgspec.ValidationError(f"must be a finite number, got {field!r} - at `{where}`")
        elif isinstance(field, int) and not isinstance(field, bool) and field < 0:
            raise msgspec.ValidationError(f"must be 0 or more, got {field} - at `{where}`")
        elif isinstance(field, int) and not isinstance(field, bool) and field > U64_MAX:
            raise msgspec.ValidationError(f"must be at most {U64_MAX}, got {field} - at `{where}`")
        elif isinstance(value, HitlOps) and field not in HITL_MODES:
            raise msgspec.ValidationError(
                f"must be one of {', '.join(HITL_MODES)}, got {field!r} - at `{where}`")
        elif isinstance(value, DreamingSettings) and name == "mode" and (
                field not in DREAMING_MODES):
            raise msgspec.ValidationError(
                f"must be one of {', '.join(DREAMING_MODES)}, got {field!r} - at `{where}`")


def load_settings(raw: str | bytes) -> tuple[MemorySettings, str | None]:
    """Stored settings, and what could not be read (None: all of it): a field that does not
    decode takes its default (rule 5)."""
    try:
        return settings_decoder.decode(raw), None
    except msgspec.ValidationError as exc:
        problem = str(exc)
    stored = msgspec.json.decode(raw)
    for _ in range(100):  # one bad field dropped per round: msgspec names the first it meets
        try:
            return msgspec.convert(stored, MemorySettings), problem
        except msgspec.ValidationError as exc:
            path = str(exc).rpartition("at `$.")[2].rstrip("`").split(".")
            holder = stored
            for key in path[:-1]:
                holder = holder.get(key) if isinstance(holder, dict) else None
            if not isinstance(holder, dict) or path[-1] not in holder:
                break
            del holder[path[-1]]
    return DEFAULT_SETTINGS, problem
