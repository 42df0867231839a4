"""RELIABILITY L5: the token file is 0600 in a 0700 directory; an exposed one is replaced."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

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
