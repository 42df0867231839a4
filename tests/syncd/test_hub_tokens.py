"""Hub tokens: hashed at rest, role-ordered, reloaded on change, and a bad file grants nothing."""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from syncd.hub.admin import key_main, token_main
from syncd.hub.tokens import (
    ROLE_RANK,
    TOKENS_FILENAME,
    AuthError,
    TokenBook,
    TokenFileError,
    authenticate,
    create_token,
    list_tokens,
    revoke_token,
    role_allows,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _auth_error(book: TokenBook, header: str | None, need: str = "read") -> AuthError:
    with pytest.raises(AuthError) as info:
        authenticate(book, header, need)
    return info.value


def test_create_stores_only_the_hash_in_a_private_file(tmp_path: Path) -> None:
    data = tmp_path / "hub"
    raw = create_token(data, role="write", name="laptop")
    path = data / TOKENS_FILENAME
    assert raw.startswith("syncd_") and len(raw) > 40
    assert _mode(path) == 0o600 and _mode(data) == 0o700
    text = path.read_text()
    assert raw not in text and raw.removeprefix("syncd_") not in text
    (entry,) = json.loads(text)["tokens"]
    assert entry["name"] == "laptop" and entry["role"] == "write" and entry["revoked_at"] is None
    assert len(entry["sha256"]) == 64
    assert TokenBook(data).lookup(raw) == ("laptop", "write")
    assert [p.name for p in data.iterdir()] == [TOKENS_FILENAME]  # no temp file left behind


def test_list_never_shows_the_hash(tmp_path: Path) -> None:
    create_token(tmp_path, role="admin", name="ops")
    (row,) = list_tokens(tmp_path)
    assert set(row) == {"name", "role", "plan", "created_at", "revoked_at"}
    assert row["created_at"] is not None and row["created_at"].endswith("Z")


@pytest.mark.parametrize(("have", "need", "allowed"), [
    ("read", "read", True), ("read", "write", False), ("read", "admin", False),
    ("write", "read", True), ("write", "write", True), ("write", "admin", False),
    ("admin", "read", True), ("admin", "write", True), ("admin", "admin", True),
])
def test_roles_are_ordered(have: str, need: str, allowed: bool) -> None:
    assert role_allows(have, need) is allowed
    assert list(ROLE_RANK) == ["read", "write", "admin"]


def test_revoked_token_is_refused(tmp_path: Path) -> None:
    raw = create_token(tmp_path, role="read", name="old")
    book = TokenBook(tmp_path)
    assert book.lookup(raw) == ("old", "read")
    assert revoke_token(tmp_path, "old") is True
    assert book.lookup(raw) is None
    err = _auth_error(book, f"Bearer {raw}")
    assert (err.status, err.code, err.message) == (401, "unauthorized", "unknown token")
    assert revoke_token(tmp_path, "old") is False
    assert list_tokens(tmp_path)[0]["revoked_at"] is not None


def test_a_revoked_name_can_be_reused_but_an_active_one_cannot(tmp_path: Path) -> None:
    create_token(tmp_path, role="read", name="laptop")
    with pytest.raises(ValueError, match="name"):
        create_token(tmp_path, role="write", name="laptop")
    revoke_token(tmp_path, "laptop")
    raw = create_token(tmp_path, role="write", name="laptop")
    assert TokenBook(tmp_path).lookup(raw) == ("laptop", "write")


@pytest.mark.parametrize("role", ["", "Read", "owner"])
def test_bad_role_is_refused_naming_the_field(tmp_path: Path, role: str) -> None:
    with pytest.raises(ValueError, match=r"role: .* read, write, admin"):
        create_token(tmp_path, role=role, name="x")
    assert not (tmp_path / TOKENS_FILENAME).exists()


@pytest.mark.parametrize("name", ["", "x" * 65, "tab\there", "new\nline"])
def test_bad_name_is_refused_naming_the_field(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        create_token(tmp_path, role="read", name=name)


def test_another_process_write_is_seen_without_restart(tmp_path: Path) -> None:
    first = create_token(tmp_path, role="read", name="a")
    book = TokenBook(tmp_path)
    assert book.lookup(first) == ("a", "read")
    before = (tmp_path / TOKENS_FILENAME).stat()
    second = create_token(tmp_path, role="admin", name="b")  # as `syncd hub token create` would
    # Pin mtime to the old value: the change must still be seen (new inode and size).
    os.utime(tmp_path / TOKENS_FILENAME, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert book.lookup(second) == ("b", "admin")
    assert book.lookup(first) == ("a", "read")


def test_missing_file_means_no_tokens(tmp_path: Path) -> None:
    book = TokenBook(tmp_path / "absent")
    assert book.lookup("syncd_anything") is None
    assert list_tokens(tmp_path / "absent") == []


@pytest.mark.parametrize("content", [
    "", "{not json", "[]", '{"version": 1}', '{"version": 2, "tokens": []}',
    '{"version": 1, "tokens": [{"name": "x", "role": "root", "sha256": "' + "0" * 64
    + '", "created_at": "2026-01-01T00:00:00Z", "revoked_at": null}]}',
    '{"version": 1, "tokens": [{"name": "x", "role": "read", "sha256": "short",'
    ' "created_at": "2026-01-01T00:00:00Z", "revoked_at": null}]}',
])
def test_corrupt_file_raises_naming_the_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / TOKENS_FILENAME
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match=str(path)):
        TokenBook(tmp_path)
    with pytest.raises(TokenFileError):
        create_token(tmp_path, role="read", name="x")


def test_file_corrupted_after_load_grants_nothing(tmp_path: Path) -> None:
    raw = create_token(tmp_path, role="admin", name="ops")
    book = TokenBook(tmp_path)
    assert book.lookup(raw) == ("ops", "admin")
    (tmp_path / TOKENS_FILENAME).write_text("{garbage")
    with pytest.raises(TokenFileError):
        book.lookup(raw)
    with pytest.raises(TokenFileError):
        authenticate(book, f"Bearer {raw}", "read")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_exposed_file_is_refused(tmp_path: Path, mode: int) -> None:
    raw = create_token(tmp_path, role="admin", name="ops")
    book = TokenBook(tmp_path)
    (tmp_path / TOKENS_FILENAME).chmod(mode)
    with pytest.raises(TokenFileError, match="chmod 600"):
        TokenBook(tmp_path)
    with pytest.raises(TokenFileError, match="chmod 600"):  # a chmod alone is noticed too
        book.lookup(raw)


def test_authenticate(tmp_path: Path) -> None:
    raw = create_token(tmp_path, role="read", name="reader")
    book = TokenBook(tmp_path)
    assert authenticate(book, f"Bearer {raw}", "read") == ("reader", "read")
    assert authenticate(book, f"Bearer  {raw} ", "read") == ("reader", "read")
    for header in [None, "", raw, f"bearer {raw}", f"Token {raw}"]:
        err = _auth_error(book, header)
        assert (err.status, err.code) == (401, "unauthorized")
        assert "Bearer" in err.message
    for header in ["Bearer ", "Bearer wrong", f"Bearer {raw}x"]:
        err = _auth_error(book, header)
        assert (err.status, err.code, err.message) == (401, "unauthorized", "unknown token")
    err = _auth_error(book, f"Bearer {raw}", "write")
    assert (err.status, err.code) == (403, "forbidden")
    assert err.message == "token role `read` below required `write`"


def test_token_main_create_prints_a_working_token(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert token_main(["create", "--data-dir", str(tmp_path), "--role", "write",
                       "--name", "ci"]) == 0
    out, err = capsys.readouterr()
    raw = out.removesuffix("\n")
    assert out == raw + "\n" and "\n" not in raw
    assert "once" in err and raw not in err
    assert authenticate(TokenBook(tmp_path), f"Bearer {raw}", "write") == ("ci", "write")

    assert token_main(["list", "--data-dir", str(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert "ci" in out and "write" in out and raw not in out

    assert token_main(["revoke", "--data-dir", str(tmp_path), "--name", "ci"]) == 0
    assert TokenBook(tmp_path).lookup(raw) is None
    assert token_main(["revoke", "--data-dir", str(tmp_path), "--name", "ci"]) == 1
    assert "name" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "field"), [
    (["create", "--role", "root", "--name", "x"], "role"),
    (["create", "--role", "read", "--name", ""], "name"),
    (["create", "--role", "read"], "--name"),
])
def test_token_main_bad_input_exits_2_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], field: str) -> None:
    assert token_main([*argv, "--data-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and field in err
    assert not (tmp_path / TOKENS_FILENAME).exists()


def test_token_main_refuses_a_corrupt_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / TOKENS_FILENAME).write_text("{")
    (tmp_path / TOKENS_FILENAME).chmod(0o600)
    assert token_main(["list", "--data-dir", str(tmp_path)]) == 2
    assert TOKENS_FILENAME in capsys.readouterr().err


def test_concurrent_creates_lose_nothing(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        raws = list(pool.map(lambda i: create_token(tmp_path, role="read", name=f"n{i}"),
                             range(16)))
    book = TokenBook(tmp_path)
    assert sorted(book.lookup(raw) or ("", "") for raw in raws) == sorted(
        (f"n{i}", "read") for i in range(16))


def test_admin_commands_refuse_a_hub_data_dir_that_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo must not list no tokens (exit 0) nor mint a key the hub never uses; the first
    ``token create`` may still come before the hub's first start."""
    typo = tmp_path / "syncd-hbu"
    assert token_main(["list", "--data-dir", str(typo)]) == 1
    assert token_main(["revoke", "--data-dir", str(typo), "--name", "ci"]) == 1
    assert key_main(["--data-dir", str(typo)]) == 1
    assert "--data-dir: no hub data directory at" in capsys.readouterr().err
    assert not typo.exists()
    assert token_main(["create", "--data-dir", str(typo), "--role", "read", "--name", "a"]) == 0
    assert key_main(["--data-dir", str(typo)]) == 0
