"""protocol.settings: the plane's coded defaults, partial decoding and merge_patch."""

import msgspec
import pytest

from protocol.settings import (
    DEFAULT_SETTINGS,
    MemorySettings,
    json_encoder,
    load_settings,
    merge_patch,
    replace_settings,
    settings_decoder,
)

# Contract §4.5, verbatim.
CONTRACT_DEFAULTS = b"""
{
  "extraction_enabled": true, "min_events": 1,
  "default_limit": 8, "default_expand_hops": 1, "ann_threshold": 0.0,
  "w_rrf": 1.0, "w_semantic": 0.6, "w_keyword": 0.3, "w_graph": 0.5,
  "w_importance": 0.4, "w_recency": 0.3, "half_life_days": 30.0, "rrf_k": 60.0,
  "dreaming": { "enabled": false, "interval_secs": 86400, "mode": "full", "realm_scope": [],
                "max_tool_calls": 100, "wall_clock_secs": 3600,
                "connector_read_budget": 25, "connector_read_max_bytes": 4194304, "mutation_cap": 60 },
  "hitl": { "enabled": false,
            "ops": { "add":"auto", "update":"post_hoc", "invalidate":"gate", "merge":"gate", "archive":"gate",
                     "link_entity_cross_realm":"gate", "relationship_write":"post_hoc",
                     "promote_file_candidate":"auto" },
            "confidence_threshold": 0.6, "realm_scope": [], "type_scope": [] }
}
"""


# What the current plane changed since the contract (memory_settings.rs @ c090779,
# docs/kyma-current-surface.md §3): keys renamed in `dreaming`, blocks added.
RENAMED_DREAMING = {"connector_read_budget": "data_source_read_budget",
                    "connector_read_max_bytes": "data_source_read_max_bytes"}
CURRENT_PLANE_ADDITIONS = b"""
{
  "w_reinforcement": 0.0,
  "reinforcement": { "enabled": false, "hit_weight": 0.3, "miss_penalty": 0.3, "half_life_days": 30.0 },
  "precedent": { "enabled": true, "max_distance": 0.15, "memory_limit": 20 },
  "mmr": { "enabled": false, "lambda": 0.7, "pool_multiplier": 3 },
  "validity_gate": { "enabled": false, "llm_escalation_enabled": false, "min_confidence": 0.35,
                     "min_content_chars": 12 },
  "schema_induction": { "enabled": false, "min_examples": 3, "interval_days": 7 },
  "default_visibility": "public"
}
"""


def test_defaults_equal_the_contract() -> None:
    expected = msgspec.json.decode(CONTRACT_DEFAULTS)
    expected["dreaming"] = {RENAMED_DREAMING.get(k, k): v for k, v in expected["dreaming"].items()}
    expected.update(msgspec.json.decode(CURRENT_PLANE_ADDITIONS))
    expected["embedding_model"] = None
    assert msgspec.json.decode(json_encoder.encode(DEFAULT_SETTINGS)) == expected


def test_defaults_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_SETTINGS.w_graph = 0.9  # type: ignore[misc]


def test_partial_decode_keeps_defaults() -> None:
    settings = settings_decoder.decode(b'{"w_graph":0.7,"hitl":{"ops":{"add":"gate"}},"mmr":{}}')
    assert settings.w_graph == 0.7
    assert settings.hitl.ops.add == "gate"
    assert settings.hitl.ops.update == "post_hoc"
    assert settings.hitl.confidence_threshold == 0.6
    assert settings.dreaming == DEFAULT_SETTINGS.dreaming
    assert settings_decoder.decode(b"{}") == DEFAULT_SETTINGS


def test_plane_f32_threshold_decodes() -> None:
    settings = settings_decoder.decode(b'{"hitl":{"confidence_threshold":0.6000000238418579}}')
    assert settings.hitl.confidence_threshold == pytest.approx(0.6)


def test_patch_changes_only_the_given_key() -> None:
    patched = merge_patch(DEFAULT_SETTINGS, {"w_graph": 0.7})
    assert patched.w_graph == 0.7
    assert msgspec.structs.replace(patched, w_graph=0.5) == DEFAULT_SETTINGS


def test_patch_merges_nested_objects_over_current_values() -> None:
    current = merge_patch(DEFAULT_SETTINGS, {"w_recency": 0.1, "dreaming": {"enabled": True}})
    patched = merge_patch(
        current, {"dreaming": {"mode": "sources"}, "hitl": {"ops": {"merge": "auto"}}}
    )
    assert patched.w_recency == 0.1
    assert patched.dreaming.enabled is True
    assert patched.dreaming.mode == "sources"
    assert patched.dreaming.interval_secs == 86400
    assert patched.hitl.ops.merge == "auto"
    assert patched.hitl.ops.invalidate == "gate"
    assert current.dreaming.mode == "full"  # the input is untouched


def test_patch_accepts_int_for_float() -> None:
    patched = merge_patch(DEFAULT_SETTINGS, {"w_graph": 1})
    assert patched.w_graph == 1.0
    assert isinstance(patched.w_graph, float)


@pytest.mark.parametrize(("patch", "message"), [
    ({"w_keywrd": 0.5}, r"did you mean w_keyword\? - at `\$\.w_keywrd`"),
    ({"mmr": {"lamda": 0.5}}, r"did you mean lambda\? - at `\$\.mmr\.lamda`"),
    ({"hitl": {"ops": {"ad": "gate"}}}, r"did you mean add\? - at `\$\.hitl\.ops\.ad`"),
    ({"zzz": 1}, r"^unknown setting - at `\$\.zzz`"),
])
def test_patch_refuses_an_unknown_key_naming_it(patch: dict[str, object], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message):
        merge_patch(DEFAULT_SETTINGS, patch)
    assert merge_patch(DEFAULT_SETTINGS, {"dreaming": {"connector_read_budget": 3}}
                       ).dreaming.data_source_read_budget == 3  # an alias is a known key


def test_the_planes_replace_ignores_unknown_keys() -> None:
    """A newer Kyma client may send a block this syncd does not model (rule 8)."""
    replaced = replace_settings({"w_graph": 0.9, "not_a_knob": True, "mmr": {"new": 1}})
    assert replaced == msgspec.structs.replace(DEFAULT_SETTINGS, w_graph=0.9)


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"w_graph": "x"}, r"\$\.w_graph"),
        ({"dreaming": {"interval_secs": "daily"}}, r"\$\.dreaming\.interval_secs"),
        ({"hitl": None}, r"\$\.hitl"),
        ({"embedding_model": 3}, r"\$\.embedding_model"),
        ({"min_events": -2}, r"0 or more, got -2 - at `\$\.min_events`"),
        ({"dreaming": {"mutation_cap": -1}}, r"\$\.dreaming\.mutation_cap"),
        ({"dreaming": {"mode": "nightly"}}, r"one of full, .* - at `\$\.dreaming\.mode`"),
        ({"hitl": {"ops": {"merge": "AUTO"}}}, r"\$\.hitl\.ops\.merge"),
    ],
)
def test_patch_with_wrong_type_names_the_field(patch: dict[str, object], path: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=path):
        merge_patch(DEFAULT_SETTINGS, patch)


def test_a_stored_mode_a_newer_plane_added_still_decodes() -> None:
    """Only a PUT is held to the modes this syncd knows; what a plane sends decodes."""
    settings, problem = load_settings(b'{"dreaming":{"mode":"weekly"}}')
    assert settings.dreaming.mode == "weekly" and problem is None


def test_round_trip() -> None:
    settings = MemorySettings(embedding_model="fastembed/bge-small-en-v1.5", w_reinforcement=0.2)
    assert settings_decoder.decode(json_encoder.encode(settings)) == settings
