"""The plane's ``MemorySettings`` (contract §4.5, and the blocks the current plane added:
``pensieve-server/src/agent/memory_settings.rs``, docs/kyma-current-surface.md), with its
coded defaults.

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
   plane's enums (HITL ``auto|post_hoc|gate``, dreaming ``full|housekeeping_only|sources``,
   ``default_visibility`` ``public|private``).
   Decoding stays lenient about modes: a newer plane may add one. ``load_settings`` reads
   stored settings that an older syncd let such a value into: each field that does not decode
   falls back to its default, so a store still opens.
6. ``dreaming.connector_read_budget`` and ``connector_read_max_bytes`` are the plane's names
   before its connectors became data sources: read (decoded, converted, patched) as aliases of
   ``data_source_read_budget`` and ``data_source_read_max_bytes``, never written. An old name
   given beside its new one in a patch is dropped (the new one wins).
7. ``replace_settings`` is the plane's PUT: the body over the coded defaults (serde
   ``default``), nothing of the current settings kept, checked as ``merge_patch`` checks.
8. A patch naming a key no setting has (``w_keywrd``) is refused naming its path, with the
   nearest key as a hint: a typo would otherwise answer 200 and change nothing. The plane's
   replace (rule 7) ignores such keys, as the plane's serde does (a newer Kyma client may send
   a block this syncd does not model).
"""

import difflib
import math
from typing import Any

import msgspec

ALIASES = {"connector_read_budget": "data_source_read_budget",
           "connector_read_max_bytes": "data_source_read_max_bytes"}  # old name -> new (rule 6)


class DreamingSettings(msgspec.Struct, kw_only=True, frozen=True):
    enabled: bool = False
    interval_secs: int = 86400
    mode: str = "full"  # full | housekeeping_only | sources
    realm_scope: list[str] = []
    max_tool_calls: int = 100
    wall_clock_secs: int = 3600
    data_source_read_budget: int = 25
    data_source_read_max_bytes: int = 4194304
    mutation_cap: int = 60
    connector_read_budget: int | msgspec.UnsetType = msgspec.UNSET  # input only (rule 6)
    connector_read_max_bytes: int | msgspec.UnsetType = msgspec.UNSET  # input only (rule 6)

    def __post_init__(self) -> None:
        for old, new in ALIASES.items():
            value = getattr(self, old)
            if value is not msgspec.UNSET:
                msgspec.structs.force_setattr(self, new, value)
                msgspec.structs.force_setattr(self, old, msgspec.UNSET)


class ReinforcementSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Usage-based reinforcement (the plane's M8.1): off, so ``w_reinforcement`` is ignored."""

    enabled: bool = False
    hit_weight: float = 0.3
    miss_penalty: float = 0.3
    half_life_days: float = 30.0


class PrecedentSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Worked-example retrieval (M8.2): the plane's only block that defaults on."""

    enabled: bool = True
    max_distance: float = 0.15
    memory_limit: int = 20


class MmrSettings(msgspec.Struct, kw_only=True, frozen=True):
    """MMR diversity re-ranking (M8.3a)."""

    enabled: bool = False
    lambda_: float = msgspec.field(default=0.7, name="lambda")
    pool_multiplier: int = 3


class ValidityGateSettings(msgspec.Struct, kw_only=True, frozen=True):
    """The validity gate on new memories (M8.3b); ``min_confidence`` is an f32 (rule 4)."""

    enabled: bool = False
    llm_escalation_enabled: bool = False
    min_confidence: float = 0.35
    min_content_chars: int = 12


class SchemaInductionSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Procedure induction during dreaming (M8.4)."""

    enabled: bool = False
    min_examples: int = 3
    interval_days: int = 7


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
    w_reinforcement: float = 0.0
    reinforcement: ReinforcementSettings = msgspec.field(default_factory=ReinforcementSettings)
    precedent: PrecedentSettings = msgspec.field(default_factory=PrecedentSettings)
    mmr: MmrSettings = msgspec.field(default_factory=MmrSettings)
    validity_gate: ValidityGateSettings = msgspec.field(default_factory=ValidityGateSettings)
    schema_induction: SchemaInductionSettings = msgspec.field(
        default_factory=SchemaInductionSettings)
    dreaming: DreamingSettings = msgspec.field(default_factory=DreamingSettings)
    hitl: HitlSettings = msgspec.field(default_factory=HitlSettings)
    default_visibility: str = "public"  # public | private
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


def _new_names_win(patch: dict[str, object]) -> dict[str, object]:
    """``patch`` without an old dreaming key given beside its new one (rule 6)."""
    dreaming = patch.get("dreaming")
    if not isinstance(dreaming, dict) or not any(
            old in dreaming and new in dreaming for old, new in ALIASES.items()):
        return patch
    kept = {k: v for k, v in dreaming.items() if not (k in ALIASES and ALIASES[k] in dreaming)}
    return {**patch, "dreaming": kept}


def _check_keys(patch: dict[str, object], kind: type[msgspec.Struct], path: str) -> None:
    """Rule 8: every key of ``patch`` is a field of ``kind`` (nested blocks too)."""
    fields = {info.encode_name: info for info in msgspec.structs.fields(kind)}
    for key, value in patch.items():
        info = fields.get(key)
        if info is None:
            guess = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {guess[0]}?" if guess else ""
            raise msgspec.ValidationError(f"unknown setting{hint} - at `{path}.{key}`")
        if isinstance(value, dict) and isinstance(info.type, type) and issubclass(
                info.type, msgspec.Struct):
            _check_keys(value, info.type, f"{path}.{key}")


def merge_patch(current: MemorySettings, patch: dict[str, object], *,
                unknown_keys: bool = False) -> MemorySettings:
    """Apply only the keys in ``patch`` to ``current``; raise ``msgspec.ValidationError``
    naming the path on a bad type or value (rule 5), or on a key no setting has unless
    ``unknown_keys`` (rule 8)."""
    if not unknown_keys:
        _check_keys(patch, MemorySettings, "$")
    merged = msgspec.convert(_merge(msgspec.to_builtins(current), _new_names_win(patch)),
                             MemorySettings)
    _check_numbers(merged, "$")
    if not merged.rrf_k > 0:
        raise msgspec.ValidationError(f"must be above 0, got {merged.rrf_k!r} - at `$.rrf_k`")
    return merged


def replace_settings(body: dict[str, object]) -> MemorySettings:
    """The plane's PUT (rule 7): ``body`` over the coded defaults."""
    return merge_patch(DEFAULT_SETTINGS, body, unknown_keys=True)


HITL_MODES = ("auto", "post_hoc", "gate")
DREAMING_MODES = ("full", "housekeeping_only", "sources")
VISIBILITIES = ("public", "private")
U64_MAX = 2**64 - 1  # the plane's counts are u64


def _check_numbers(value: msgspec.Struct, path: str) -> None:
    """Rule 5, field by field: finite floats, counts in u64's range, modes of the plane's
    enums."""
    if isinstance(value, MemorySettings) and value.default_visibility not in VISIBILITIES:
        raise msgspec.ValidationError(f"must be one of {', '.join(VISIBILITIES)}, got "
                                      f"{value.default_visibility!r} - at `$.default_visibility`")
    for info in msgspec.structs.fields(value):
        name = info.name
        field, where = getattr(value, name), f"{path}.{info.encode_name}"
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
