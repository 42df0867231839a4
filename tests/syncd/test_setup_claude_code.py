"""``syncd setup claude-code`` and ``setup mcp --print``, run as the installed CLI in a
subprocess on files that already hold other hooks, servers and keys (issue 34, point 2)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from tests.syncd.processes import cli

OTHER_SETTINGS: dict[str, Any] = {
    "model": "opus", "permissions": {"allow": ["Bash(make test)"]},
    "hooks": {
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "~/bin/lint-prompt",
                                         "timeout": 3}]}],
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command",
                                                      "command": "~/bin/guard"}]}]}}
OTHER_MCP: dict[str, Any] = {"numStartups": 12, "mcpServers": {
    "github": {"command": "gh-mcp", "args": ["serve"]}}, "projects": {"/src/x": {}}}
SYNCD = [sys.executable, "-m", "syncd"]  # how the tests run syncd (setup.syncd_command)


def write(path: Path, value: object) -> bytes:
    path.write_text(json.dumps(value, indent=1))
    return path.read_bytes()


async def setup(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return await cli(tmp_path, "--data-dir", str(tmp_path / "data"), "setup", "claude-code",
                     "--settings", str(tmp_path / "settings.json"),
                     "--mcp-config", str(tmp_path / "claude.json"), *extra)


def hook_entry(tmp_path: Path) -> dict[str, Any]:
    command = shlex.join([*SYNCD, "--data-dir", str(tmp_path / "data"), "recall", "--hook"])
    return {"type": "command", "command": command, "timeout": 5}


async def test_setup_merges_is_idempotent_and_uninstall_restores_the_rest(
        tmp_path: Path) -> None:
    settings, mcp = tmp_path / "settings.json", tmp_path / "claude.json"
    settings_before, mcp_before = write(settings, OTHER_SETTINGS), write(mcp, OTHER_MCP)

    code, out, err = await setup(tmp_path)
    assert code == 0, err
    assert f"updated {settings} (the previous one is {settings}.syncd-backup)" in out
    assert (tmp_path / "settings.json.syncd-backup").read_bytes() == settings_before
    merged = json.loads(settings.read_text())
    assert merged["model"] == "opus" and merged["permissions"] == OTHER_SETTINGS["permissions"]
    assert merged["hooks"]["PreToolUse"] == OTHER_SETTINGS["hooks"]["PreToolUse"]
    assert merged["hooks"]["UserPromptSubmit"] == [
        *OTHER_SETTINGS["hooks"]["UserPromptSubmit"], {"hooks": [hook_entry(tmp_path)]}]
    assert merged["hooks"]["SessionStart"] == [{"hooks": [hook_entry(tmp_path)]}]
    config = json.loads(mcp.read_text())
    assert config["numStartups"] == 12 and config["projects"] == OTHER_MCP["projects"]
    assert config["mcpServers"] == {**OTHER_MCP["mcpServers"], "syncd": {
        "command": sys.executable, "args": ["-m", "syncd", "--data-dir",
                                            str(tmp_path / "data"), "mcp"]}}

    after_once = settings.read_bytes(), mcp.read_bytes()
    code, out, err = await setup(tmp_path)  # twice: nothing changes
    assert code == 0 and out == f"unchanged {settings}\nunchanged {mcp}\n", (out, err)
    assert (settings.read_bytes(), mcp.read_bytes()) == after_once

    code, out, err = await setup(tmp_path, "--uninstall")
    assert code == 0, err
    assert json.loads(settings.read_text()) == OTHER_SETTINGS
    assert json.loads(mcp.read_text()) == OTHER_MCP
    assert json.loads(mcp_before) == OTHER_MCP


async def test_an_older_install_is_replaced_in_place(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    old = {"type": "command", "command": "/old/venv/bin/syncd recall --hook", "timeout": 9}
    write(settings, {"hooks": {"UserPromptSubmit": [{"hooks": [
        {"type": "command", "command": "first"}, old, {"type": "command", "command": "last"}]}]}})
    code, _, err = await setup(tmp_path)
    assert code == 0, err
    groups = json.loads(settings.read_text())["hooks"]["UserPromptSubmit"]
    assert groups == [{"hooks": [{"type": "command", "command": "first"}, hook_entry(tmp_path),
                                 {"type": "command", "command": "last"}]}]


async def test_missing_files_are_created_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    code, out, err = await setup(tmp_path, "--dry-run")
    assert code == 0, err
    assert not (tmp_path / "settings.json").exists() and not (tmp_path / "claude.json").exists()
    assert f"--- {tmp_path / 'settings.json'}\n" in out and '"SessionStart"' in out
    code, out, err = await setup(tmp_path)
    assert code == 0 and f"created {tmp_path / 'settings.json'}" in out, err
    assert os.stat(tmp_path / "claude.json").st_mode & 0o777 == 0o600  # it will hold tokens
    code, out, err = await setup(tmp_path, "--uninstall")
    assert json.loads((tmp_path / "settings.json").read_text()) == {}


async def test_a_file_that_is_not_json_is_refused_by_name_and_nothing_is_written(
        tmp_path: Path) -> None:
    settings, mcp = tmp_path / "settings.json", tmp_path / "claude.json"
    settings.write_text("{ not json")
    mcp_before = write(mcp, OTHER_MCP)
    code, out, err = await setup(tmp_path)
    assert code == 1 and f"syncd: {settings} is not JSON" in err and out == "", err
    assert settings.read_text() == "{ not json" and mcp.read_bytes() == mcp_before
    assert not (tmp_path / "claude.json.syncd-backup").exists()
    write(settings, ["a", "list"])
    code, _, err = await setup(tmp_path)
    assert code == 1 and "holds JSON that is not an object" in err


async def test_the_server_entry_for_other_mcp_clients(tmp_path: Path) -> None:
    code, out, err = await cli(tmp_path, "setup", "mcp", "--print")
    assert code == 0, err
    assert json.loads(out) == {"mcpServers": {"syncd": {"command": sys.executable,
                                                        "args": ["-m", "syncd", "mcp"]}}}
