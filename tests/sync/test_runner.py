"""The daemon's sync runner: a refused token is fixed by editing the token file and running
`syncd sync` (the manual pass re-reads it); no restart needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from local_store import HashingEmbedder, Store
from syncd.report import status_lines
from syncd.sync.engine import SyncOptions
from syncd.sync.runner import SyncRunner, read_plane_token
from tests.sync.harness import MODEL, start_hub


async def test_a_fixed_token_file_is_read_again_by_the_manual_pass(tmp_path: Path) -> None:
    """R21: 401 blocks the schedule; after the file is fixed, `run_now` re-reads it."""
    hub = await start_hub(tmp_path / "hub")
    token_file = tmp_path / "plane-token"
    await asyncio.to_thread(token_file.write_text, "syncd_not-a-real-token\n")
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
    runner = SyncRunner.create(store, url=hub.url, token="syncd_not-a-real-token",
                               options=SyncOptions(plane_model=MODEL), interval=3600,
                               jitter=0, token_file=token_file)
    try:
        await store.memories.save({"content": "the token was rotated on Monday"})
        report = await runner.run_now()
        assert not report.ok and report.error_kind == "auth"
        assert (await runner.status())["auth_blocked"] is True
        assert await runner.engine.scheduled() is None
        await asyncio.to_thread(token_file.write_text, hub.token + "\n")
        report = await runner.run_now()
        assert report.ok, report.error
        assert report.pushed_nodes == 1
        status = await runner.status()
        assert status["auth_blocked"] is False and status["outbox"] == 0
    finally:
        await runner.stop()
        await store.close()
        await hub.close()


def test_the_plane_token_is_the_files_first_line(tmp_path: Path) -> None:
    """As documented: "first line, trimmed" — a note on a second line was sent as part of the
    bearer token."""
    token_file = tmp_path / "control-plane-token"
    token_file.write_text("  syncd_abc123  \n# laptop token, made 2026-11-30\n")
    assert read_plane_token(token_file) == "syncd_abc123"


async def test_a_refused_pass_without_a_token_file_says_to_set_one(tmp_path: Path) -> None:
    """``control_plane.url`` with no ``token_file``: the plane answers 401, and `syncd status`
    says what is missing rather than only the plane's "missing Authorization"."""
    hub = await start_hub(tmp_path / "hub")
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
    runner = SyncRunner.create(store, url=hub.url, token=None,
                               options=SyncOptions(plane_model=MODEL), interval=3600, jitter=0)
    try:
        report = await runner.run_now()
        assert not report.ok and report.error_kind == "auth"
        status = await runner.status()
        assert status["auth_blocked"] is True and status["token_file"] is None
        lines = status_lines({"sync": status})
        assert ("    hint: no control_plane.token_file is set: the plane needs its bearer "
                "token there (first line); then `syncd sync`") in lines
    finally:
        await runner.stop()
        await store.close()
        await hub.close()


def test_a_refused_token_file_is_named_in_the_status_hint() -> None:
    lines = status_lines({"sync": {"configured": True, "url": "http://plane",
                                   "interval_secs": 60, "auth_blocked": True,
                                   "token_file": "/home/u/.config/syncd/plane-token"}})
    assert ("    hint: the plane refused the token in /home/u/.config/syncd/plane-token: put "
            "a valid one there (first line); then `syncd sync`") in lines
    quiet = status_lines({"sync": {"configured": True, "url": "http://plane",
                                   "interval_secs": 60, "auth_blocked": False}})
    assert not any("hint:" in line for line in quiet)
