"""The prompt hook's reading of the config: the daemon's data directory and URL from the config
file and ``SYNCD_*`` with ``tomllib`` alone, for the configs it can vouch for.

Rules:
  * Same answer or none: ``fast_address`` returns what ``syncd.config.load_config`` (read as
    ``syncd.commands.settings.command_settings`` reads it) resolves, or None — and then only
    ``load_config`` may say (``syncd.hook`` falls back to it). It never accepts a config ``load_config`` refuses:
    the hook is silent on a broken config, whichever option is broken.
  * So every option in the file and every ``SYNCD_*`` variable must be one of ``OPTIONS``, each
    with a check accepting a subset of what ``syncd.config`` accepts for it (a choice, a bounded
    number, an absolute path, a loopback ``listen``, a plain ``http(s)://name[:port]`` URL).
    Anything else — an option not listed, a value outside its check, a section that is not a
    table, an unreadable, non-UTF-8 or non-TOML file, a ``SYNCD_*`` variable that is not a
    listed text option — is unusual: None. Cross-option rules are kept by leaving out their
    unusual side (``embedding.model = "bge-small-en-v1.5"``, a non-loopback ``listen``, ``hub.store`` other than ``"sqlite"``).
  * Precedence and resolution as ``syncd.config``: the defaults < the file < ``SYNCD_*`` (the
    CLI applies ``--data-dir`` last); ``~`` is expanded from ``env``'s HOME by ``syncd.places``.
  * Imports: ``tomllib`` only for a file with content, else only what the hook loads already;
    never msgspec or ``syncd.config`` (tests/syncd/test_hook_config.py compares the two on a
    matrix of configs and on edge values of every listed option).
"""

from __future__ import annotations

import re  # urllib.parse imports it already
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from syncd.places import (
    ENV_PREFIX,
    default_config_path,
    default_data_dir,
    default_hub_data_dir,
    expand_path,
    has_control_characters,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy reads it
if TYPE_CHECKING:
    from typing import Any

DEFAULT_LISTEN = "127.0.0.1:7777"  # syncd.config's (a test keeps them equal)
MAX_PERIOD_SECS = 365 * 86400.0  # syncd.config's (a test keeps them equal)
LOOPBACK_LISTEN = re.compile(r"(127\.0\.0\.1|localhost|\[::1\]):([0-9]{1,5})")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# a DNS name with a letter in its last label: never an IP address, which syncd.config parses
HOST_NAME = re.compile(rf"(?=.{{1,253}}$)(?:{_LABEL}\.)*(?=[^.]*[A-Za-z]){_LABEL}\.?")

Check = Callable[["Any", Mapping[str, str]], bool]


def choice(*values: str) -> Check:
    return lambda value, env: isinstance(value, str) and value in values


def integer(low: int, high: int) -> Check:
    return lambda value, env: type(value) is int and low <= value <= high


def number(low: float, high: float, *, strict: bool = False) -> Check:
    """An int or float from ``low`` (excluded when ``strict``) to ``high``; NaN never passes."""
    def check(value: Any, env: Mapping[str, str]) -> bool:
        if type(value) not in (int, float) or not value <= high:
            return False
        return bool(value > low if strict else value >= low)
    return check


def period(*, strict: bool = False) -> Check:
    return number(0, MAX_PERIOD_SECS, strict=strict)


def boolean(value: Any, env: Mapping[str, str]) -> bool:
    return type(value) is bool


def text(value: Any, env: Mapping[str, str]) -> bool:
    return isinstance(value, str) and value.strip() != ""


def path(value: Any, env: Mapping[str, str]) -> bool:
    if not isinstance(value, str):
        return False
    found = expand_path(value, env)
    return found.is_absolute() and not has_control_characters(str(found))


def listen(value: Any, env: Mapping[str, str]) -> bool:
    match = isinstance(value, str) and LOOPBACK_LISTEN.fullmatch(value)
    return bool(match) and int(match[2]) <= 65535  # type: ignore[index]


def url(value: Any, env: Mapping[str, str]) -> bool:
    """``http(s)://name[:port][/path]``: no IP address, credentials, query or fragment."""
    if not isinstance(value, str) or any(c.isspace() or ord(c) > 0x7e for c in value):
        return False
    parts = urlsplit(value)
    host, _, port = parts.netloc.partition(":")
    return (parts.scheme in ("http", "https") and not parts.query and not parts.fragment
            and not value.endswith(("?", "#")) and "@" not in parts.netloc
            and bool(HOST_NAME.fullmatch(host)) and re.fullmatch(r"[0-9]{0,5}", port) is not None
            and int(port or 0) <= 65535)


def keys(value: Any, env: Mapping[str, str]) -> bool:
    return isinstance(value, list) and all(
        isinstance(key, str) and key and not any(c.isspace() for c in key) for key in value)


def empty_list(value: Any, env: Mapping[str, str]) -> bool:
    return value == [] and isinstance(value, list)


LOG_LEVELS = ("debug", "info", "warning", "error")
OPTIONS: dict[tuple[str, str], Check] = {
    ("daemon", "data_dir"): path,
    ("daemon", "listen"): listen,
    ("daemon", "allow_non_loopback"): boolean,
    ("daemon", "allowed_hosts"): empty_list,
    ("daemon", "max_body_bytes"): integer(1, 2**53),
    ("daemon", "shutdown_timeout_secs"): period(),
    ("daemon", "log_level"): choice(*LOG_LEVELS),
    ("embedding", "model"): choice("all-MiniLM-L6-v2", "hashing"),
    ("embedding", "idle_unload_secs"): period(),
    ("control_plane", "url"): url,
    ("control_plane", "token_file"): path,
    ("control_plane", "realm"): text,
    ("control_plane", "embedding_model"): text,
    ("control_plane", "private_memories"): choice("auto", "push", "local"),
    ("sync", "interval_secs"): period(strict=True),
    ("sync", "jitter"): number(0, 1),
    ("sync", "overlap_secs"): period(),
    ("sync", "push_batch_bytes"): integer(1, 2**53),
    ("sync", "anti_entropy_secs"): period(strict=True),
    ("sync", "long_poll"): boolean,
    ("versions", "keep"): integer(0, 10_000),
    ("versions", "max_age_days"): number(0, 36_500),
    ("entitlement", "public_keys"): keys,
    ("entitlement", "refresh_secs"): period(strict=True),
    ("hub", "data_dir"): path,
    ("hub", "listen"): listen,
    ("hub", "cursor"): choice("ingest", "origin"),
    ("hub", "token_lifetime_days"): number(0, 3650, strict=True),
    ("hub", "store"): choice("sqlite"),
    ("hub", "reembed_secs"): period(),
    ("hub", "max_held_polls"): integer(0, 2**53),
    ("mcp", "autostart"): boolean,
    ("mcp", "start_timeout_secs"): period(strict=True),
}
# SYNCD_<SECTION>_<FIELD> for the options whose variable's text is their value as is
ENV_TEXT = {f"{ENV_PREFIX}{section.upper()}_{name.upper()}": (section, name)
            for (section, name), check in OPTIONS.items()
            if check in (path, listen, text, url) or name in ("log_level", "model", "cursor")}


def fast_address(config: Path | None, env: Mapping[str, str]) -> tuple[Path, str] | None:
    """(``daemon.data_dir``, the URL for ``daemon.listen``) as ``load_config`` resolves them,
    or None when the config is unusual (the module docstring's rules)."""
    raw = _read(config, env)
    if raw is None or not _overlay_env(raw, env):
        return None
    for section, table in raw.items():
        if not isinstance(table, dict):
            return None
        for name, value in table.items():
            check = OPTIONS.get((section, name))
            if check is None or not check(value, env):
                return None
    daemon = raw.get("daemon", {})
    data_dir = expand_path(daemon["data_dir"], env) if "data_dir" in daemon else None
    hub_dir = default_hub_data_dir(env) if "data_dir" not in raw.get("hub", {}) else None
    for default in (default_data_dir(env) if data_dir is None else None, hub_dir):
        if default is not None and (not default.is_absolute()
                                    or has_control_characters(str(default))):
            return None
    match = LOOPBACK_LISTEN.fullmatch(daemon.get("listen", DEFAULT_LISTEN))
    assert match is not None  # checked above, or the default
    return data_dir or default_data_dir(env), f"http://{match[1]}:{int(match[2])}"


def _read(config: Path | None, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The file's TOML as ``load_config`` finds it ({} for none), or None when unreadable."""
    found = default_config_path(env) if config is None else config
    if config is None and not found.exists():
        return {}
    try:
        data = expand_path(str(found), env).read_bytes()
    except OSError:
        return None
    if not data:
        return {}
    import tomllib
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _overlay_env(raw: dict[str, Any], env: Mapping[str, str]) -> bool:
    """``SYNCD_*`` text options over the file's; False for any other ``SYNCD_*`` variable."""
    for var in sorted(name for name in env if name.startswith(ENV_PREFIX)):
        option = ENV_TEXT.get(var)
        if option is None or not env[var]:
            return False
        section, name = option
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            return False
        table[name] = env[var]
    return True

