"""The daemon's sync runner: a refused token is fixed by editing the token file and running
`syncd sync` (the manual pass re-reads it); no restart needed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from local_store import HashingEmbedder, Store
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
        await store.save({"content": "the token was rotated on Monday"})
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
