"""The engine's options come from the config's ``[control_plane]`` and ``[sync]`` sections:
every value is carried over, and the defaults are the sections' own."""

from __future__ import annotations

import dataclasses

from syncd.config import ControlPlaneConfig, SyncConfig
from syncd.sync.engine import SyncOptions


def test_the_defaults_are_the_config_sections_defaults() -> None:
    assert SyncOptions.from_config(ControlPlaneConfig(), SyncConfig()) == SyncOptions()


def test_every_option_is_read_from_its_section() -> None:
    plane = ControlPlaneConfig(realm="team", embedding_model="other-model",
                               private_memories="local")
    sync = SyncConfig(overlap_secs=7.0, push_batch_bytes=4096, anti_entropy_secs=90.0,
                      long_poll=False)
    options = SyncOptions.from_config(plane, sync)
    assert dataclasses.asdict(options) == {
        "realm": "team", "plane_model": "other-model", "private_memories": "local",
        "overlap_secs": 7.0, "push_batch_bytes": 4096, "anti_entropy_secs": 90.0,
        "long_poll": False}
