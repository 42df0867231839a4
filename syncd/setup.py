"""``syncd setup``: connect an agent to syncd by merging syncd's entries into its config files.

Rules:
  * ``claude-code`` merges syncd's ``UserPromptSubmit`` and ``SessionStart`` hook entries into
    Claude Code's settings file and ``mcpServers.syncd`` into its MCP config; every other key,
    hook and server stays as it was, in its place.
  * syncd's entries are found by what they run, not by where they sit: a hook command that
    runs a syncd (an executable named ``syncd``, or ``python -m syncd``) with ``recall
    --hook``, and the server named ``syncd``. An entry of an older install (another path) is
    replaced in place, so running setup twice, or after moving the install, leaves one entry.
  * ``--uninstall`` removes only syncd's entries, and the hook groups and lists that held only
    them; what remains is the file as it was before setup.
  * A file that is not a JSON object is refused by name and left untouched. A file that does
    not exist is created (an uninstall creates nothing). A changed file is written whole to a
    temporary file beside it and renamed over it, keeping its mode; its previous bytes are
    kept beside it first (``<name>.syncd-backup``, the latest setup's). An unchanged file is
    not written.
  * ``--dry-run`` prints each file as it would be written and writes nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncd.places import running_script

HOOK_EVENTS = ("UserPromptSubmit", "SessionStart")
HOOK_TIMEOUT_SECS = 5
SERVER_NAME = "syncd"
BACKUP_SUFFIX = ".syncd-backup"


class SetupError(Exception):
    """A file setup cannot use; the message names it."""


def syncd_command() -> list[str]:
    """How to run this syncd from anywhere: the console script's absolute path, or this
    interpreter with ``-m syncd`` when started that way."""
    script = running_script()
    return [sys.executable, "-m", "syncd"] if script is None else [str(script)]


def global_args(config: Path | None, data_dir: Path | None) -> list[str]:
    """The ``--config``/``--data-dir`` the agent's commands must pass, as absolute paths."""
    args: list[str] = []
    if config is not None:
        args += ["--config", str(config.expanduser().absolute())]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir.expanduser().absolute())]
    return args


def server_entry(command: list[str], args: list[str]) -> dict[str, Any]:
    """The MCP server entry for any client that takes ``{command, args}``."""
    return {"command": command[0], "args": [*command[1:], *args, "mcp"]}


def is_syncd_hook(hook: object) -> bool:
    """A hook entry that runs some syncd's ``recall --hook``."""
    if not isinstance(hook, dict) or not isinstance(hook.get("command"), str):
        return False
    try:
        words = shlex.split(hook["command"])
    except ValueError:
        return False
    runs_syncd = bool(words) and (Path(words[0]).name == "syncd" or any(
        words[i:i + 2] == ["-m", "syncd"] for i in range(len(words))))
    return runs_syncd and any(words[i:i + 2] == ["recall", "--hook"]
                              for i in range(len(words)))


def _hooks_with(hooks: dict[str, Any], event: str, entry: dict[str, Any] | None) -> None:
    """``hooks[event]`` with every syncd hook removed, then ``entry`` (when given) where the
    first one was, or appended as a group of its own."""
    groups = hooks.get(event)
    if groups is not None and not isinstance(groups, list):
        raise SetupError(f"hooks.{event} must be a list")
    kept: list[Any] = []
    placed = False
    for group in groups or []:
        inner = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(inner, list) or not any(is_syncd_hook(h) for h in inner):
            kept.append(group)
            continue
        others = [h for h in inner if not is_syncd_hook(h)]
        if entry is not None and not placed:
            others.insert(next(i for i, h in enumerate(inner) if is_syncd_hook(h)), entry)
            placed = True
        if others:
            kept.append({**group, "hooks": others})
    if entry is not None and not placed:
        kept.append({"hooks": [entry]})
    if kept:
        hooks[event] = kept
    else:
        hooks.pop(event, None)


def merged_settings(settings: dict[str, Any], hook_command: str | None) -> dict[str, Any]:
    """``settings`` with syncd's hook entries (``hook_command``), or without them (None)."""
    result = dict(settings)
    hooks = result.get("hooks", {})
    if not isinstance(hooks, dict):
        raise SetupError("hooks must be a JSON object")
    hooks = dict(hooks)
    entry = None if hook_command is None else {
        "type": "command", "command": hook_command, "timeout": HOOK_TIMEOUT_SECS}
    for event in HOOK_EVENTS:
        _hooks_with(hooks, event, entry)
    if hooks:
        result["hooks"] = hooks
    else:
        result.pop("hooks", None)
    return result


def merged_mcp(config: dict[str, Any], server: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` with ``mcpServers.syncd`` set to ``server``, or removed (None)."""
    result = dict(config)
    servers = result.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise SetupError("mcpServers must be a JSON object")
    servers = dict(servers)
    if server is None:
        servers.pop(SERVER_NAME, None)
    else:
        servers[SERVER_NAME] = server
    if servers:
        result["mcpServers"] = servers
    else:
        result.pop("mcpServers", None)
    return result


def read_object(path: Path) -> tuple[dict[str, Any], bytes | None]:
    """The JSON object in ``path`` ({} when it does not exist) and its bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        raise SetupError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise SetupError(f"{path} is not JSON ({exc}); it was left as it is") from None
    if not isinstance(value, dict):
        raise SetupError(f"{path} holds JSON that is not an object; it was left as it is")
    return value, raw


@dataclass
class Change:
    path: Path
    before: bytes | None
    after: dict[str, Any]

    @property
    def text(self) -> str:
        return json.dumps(self.after, indent=2, ensure_ascii=False) + "\n"

    @property
    def changed(self) -> bool:
        before = None if self.before is None else json.loads(self.before or b"{}")
        return before != self.after and not (before is None and not self.after)


def write(change: Change) -> None:
    """The file replaced whole (module rules): backup first, then a renamed temporary file."""
    path = change.path
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600
    if change.before is not None:
        mode = path.stat().st_mode & 0o777
        backup = path.with_name(path.name + BACKUP_SUFFIX)
        fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(change.before)
    replace_file(path, change.text.encode("utf-8"), mode)


def replace_file(path: Path, data: bytes, mode: int) -> None:
    """``path`` holds ``data`` (mode ``mode``) whole or not at all: a temporary file beside it,
    fsynced, then renamed over it."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def claude_code(settings_path: Path, mcp_path: Path, *, command: list[str], args: list[str],
                uninstall: bool) -> list[Change]:
    """The two files' changes (nothing written): read both first, so a refused file leaves the
    other untouched too."""
    settings, settings_raw = read_object(settings_path)
    mcp, mcp_raw = read_object(mcp_path)
    hook = None if uninstall else shlex.join([*command, *args, "recall", "--hook"])
    server = None if uninstall else server_entry(command, args)
    try:
        new_settings = merged_settings(settings, hook)
    except SetupError as exc:
        raise SetupError(f"{settings_path}: {exc}; it was left as it is") from None
    try:
        new_mcp = merged_mcp(mcp, server)
    except SetupError as exc:
        raise SetupError(f"{mcp_path}: {exc}; it was left as it is") from None
    return [Change(settings_path, settings_raw, new_settings), Change(mcp_path, mcp_raw, new_mcp)]
