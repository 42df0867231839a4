"""RELIABILITY L5: the token file is 0600 in a 0700 directory; an exposed one is replaced."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store
from syncd.token import ensure_token, read_token, token_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_created_private_and_stable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = ensure_token(data)
    assert len(token) >= 32
    assert mode(data) == 0o700 and mode(token_path(data)) == 0o600
    assert ensure_token(data) == token == read_token(token_path(data))


def test_world_readable_token_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = ensure_token(tmp_path)
    token_path(tmp_path).chmod(0o644)
    fresh = ensure_token(tmp_path)
    assert fresh != token and mode(token_path(tmp_path)) == 0o600
    assert "readable by others" in caplog.text and token not in caplog.text


def test_loose_directory_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    ensure_token(data)
    assert mode(data) == 0o700


def test_empty_token_file_is_replaced_and_missing_is_a_clear_error(tmp_path: Path) -> None:
    ensure_token(tmp_path)
    token_path(tmp_path).write_text("")
    token_path(tmp_path).chmod(0o600)
    assert ensure_token(tmp_path)
    with pytest.raises(FileNotFoundError, match="syncd run"):
        read_token(tmp_path / "nowhere" / "api-token")


async def test_a_missing_token_while_the_store_is_open_says_the_daemon_is_starting(
        tmp_path: Path) -> None:
    """A daemon opens its store, then writes its token: a client in between (``syncd status``
    right after ``syncd mcp`` autostarted one) is told to wait, not to start another."""
    data = tmp_path / "data"
    store = await Store.open(data, embedder=HashingEmbedder())
    try:
        with pytest.raises(FileNotFoundError, match="is starting") as starting:
            read_token(token_path(data))
        assert "syncd run" not in str(starting.value)
    finally:
        await store.close()
    with pytest.raises(FileNotFoundError, match="start the daemon once with `syncd run`"):
        read_token(token_path(data))


def test_the_light_lock_probe_names_the_stores_lock_file() -> None:
    """``syncd.storelock`` probes the store's lock without importing ``local_store`` (the hook
    asks it on every prompt whose token is missing): the two must name the same file."""
    from local_store.db import LOCK_FILENAME
    from syncd.storelock import STORE_LOCK_FILENAME
    assert STORE_LOCK_FILENAME == LOCK_FILENAME
