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
  * Imports: ``tomllib`` only for a file with content whose answer is not cached, else only
    what the hook loads already (``json``); never msgspec or ``syncd.config``
    (tests/syncd/test_hook_config.py compares the two on a matrix of configs and on edge
    values of every listed option, read and cached, and after edits).

The cache (``hook-address.json`` in ``syncd.places.default_cache_dir``): ``tomllib``'s import
is most of what a config file costs the hook (~10 ms), so a usual answer is kept, keyed by
everything it depends on — the config file's absolute path, device, inode, size, mtime_ns and
ctime_ns, the ``SYNCD_*`` variables, HOME, XDG_CONFIG_HOME and XDG_DATA_HOME, the platform, the
size and mtime_ns of this module, ``syncd.places`` and ``syncd.config`` (an upgrade or an edit
of the rules), and ``CACHE_FORMAT``. Rules:
  * A hit needs every key equal; anything else — no file, a broken or foreign cache — is a
    miss, resolved as without a cache. An empty config file, a missing one, a file that is not
    a regular file or a HOME that is not absolute are never cached (nothing to save, or
    nothing that identifies them).
  * The config is stat'ed before it is read, so a change between the two leaves the key older
    than the answer: the next run misses.
  * Racy files (git's "racy clean"; Python's .pyc keys on mtime and size alone): a change within
    the filesystem's timestamp granularity of the last one, with the same size, leaves the
    stat unchanged. So a config changed less than ``RACY_NS`` (2 s: HFS+'s 1 s, FAT's 2 s)
    before now is not cached; any later change then gets other times. Left over: a clock
    stepped back over the file's times, a filesystem that does not update mtime and ctime on
    a write, NFS's attribute cache (an edit unseen until it expires, 60 s at most by default)
    and a ``~user`` path's passwd entry changing (answers naming one are not cached).
  * Written atomically (a ``.<pid>.tmp`` file, 0600, then ``os.replace``); a cache that cannot
    be written (a read-only or missing place) is not written, the hook unchanged.
"""

from __future__ import annotations

import json  # syncd.hook imports it already
import os
import re  # urllib.parse imports it already
import stat
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from syncd.places import (
    ENV_PREFIX,
    default_cache_dir,
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


CACHE_FORMAT = 1
CACHE_FILE_NAME = "hook-address.json"
RACY_NS = 2_000_000_000  # a config changed this recently is not cached (the module docstring)
KEY_ENV = ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")  # besides every SYNCD_* variable
CODE_FILES = tuple(Path(__file__).with_name(name)
                   for name in ("hook_config.py", "places.py", "config.py"))
Address = tuple[Path, str]


def fast_address(config: Path | None, env: Mapping[str, str],
                 clock: Callable[[], int] = time.time_ns) -> Address | None:
    """(``daemon.data_dir``, the URL for ``daemon.listen``) as ``load_config`` resolves them,
    or None when the config is unusual (the module docstring's rules); from the cache when it
    holds this config's answer. ``clock`` is "now" in ns, for the racy-file rule."""
    key = cache_key(config, env)
    cache = default_cache_dir(env) / CACHE_FILE_NAME
    if key is not None and (hit := read_cache(cache, key)) is not None:
        return hit
    raw = _read(config, env)
    if raw is None or not _overlay_env(raw, env):
        return None
    found = _resolve(raw, env)
    if (found is not None and key is not None and not _names_a_user(raw)
            and clock() - max(key["mtime_ns"], key["ctime_ns"]) >= RACY_NS):
        write_cache(cache, key, found)
    return found


def cache_key(config: Path | None, env: Mapping[str, str]) -> dict[str, Any] | None:
    """What ``fast_address``'s answer for ``config`` depends on, as JSON would give it back;
    None when it is not to be cached (the module docstring's rules)."""
    if not os.path.isabs(env.get("HOME", "")):
        return None
    found = expand_path(str(default_config_path(env) if config is None else config), env)
    try:
        st = os.stat(found)
        code = [[str(path), (c := os.stat(path)).st_size, c.st_mtime_ns] for path in CODE_FILES]
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    variables = {name: env[name] for name in env
                 if name.startswith(ENV_PREFIX) or name in KEY_ENV}
    return {"format": CACHE_FORMAT, "config": os.path.abspath(found), "dev": st.st_dev,
            "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "env": dict(sorted(variables.items())),
            "platform": sys.platform, "code": code}


def read_cache(cache: Path, key: dict[str, Any]) -> Address | None:
    """The cached answer for ``key``, or None (a miss: no file, another key, not ours)."""
    try:
        entry = json.loads(cache.read_bytes())
    except (OSError, ValueError):
        return None
    answer = entry.get("answer") if isinstance(entry, dict) and entry.get("key") == key else None
    if not isinstance(answer, list) or len(answer) != 2 or not all(
            isinstance(part, str) for part in answer):
        return None
    where, url = answer  # and only an answer fast_address could give
    listen = LOOPBACK_LISTEN.fullmatch(url.removeprefix("http://"))
    if (not os.path.isabs(where) or has_control_characters(where) or listen is None
            or not url.startswith("http://") or int(listen[2]) > 65535):
        return None
    return Path(where), url


def write_cache(cache: Path, key: dict[str, Any], found: Address) -> None:
    """Keep ``found`` for ``key``, atomically; silently not when the place is not writable."""
    text = json.dumps({"key": key, "answer": [str(found[0]), found[1]]})
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with open(fd, "w", encoding="ascii") as out:
            out.write(text)
        os.replace(tmp, cache)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _names_a_user(raw: dict[str, Any]) -> bool:
    """A ``~user`` value: its expansion reads the passwd database, which no key covers."""
    return any(isinstance(value, str) and value.startswith("~") and value != "~"
               and not value.startswith("~/")
               for table in raw.values() for value in table.values())


def _resolve(raw: dict[str, Any], env: Mapping[str, str]) -> Address | None:
    """``fast_address``'s answer for the file's TOML with ``SYNCD_*`` over it."""
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

