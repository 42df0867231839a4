"""syncd's configuration: one typed, frozen object, loaded once at startup.

Rules:
  * Precedence: the ``DEFAULT_…`` constants < the TOML file < ``SYNCD_<SECTION>_<FIELD>``
    environment variables. (CLI flags come last: the caller applies them with
    ``msgspec.structs.replace``, which re-runs the same validation.)
  * Unknown sections, options and ``SYNCD_<SECTION>_*`` variables are errors: a typo must never
    fall back to a default silently. (The opposite of wire types, which ignore unknown fields.)
  * Every error is a ``ConfigError`` naming the dotted field, the bad value as written, and where
    it came from (the file, or the environment variable).
  * Validation lives in each section's ``__post_init__``, so a config built in code (tests, CLI
    overrides through ``replace``) is checked exactly like one decoded from a file.
  * Paths are resolved here and nowhere else: ``~`` is expanded, and the result must be absolute.
  * An error never shows a password: a value written ``scheme://user:password@host`` (a proxy
    URL, a DSN) is shown with ``***`` for the password.
  * The section structs' defaults (the ``DEFAULT_…`` constants) are the only ones: an object
    that is configured takes its section, or the values it needs from it, and repeats no
    default. Addresses and URLs are parsed and checked in ``syncd/addresses.py``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec
import msgspec.inspect as mi

from syncd.addresses import LOOPBACK_HOST_NAMES as LOOPBACK_HOST_NAMES
from syncd.addresses import check_host, check_plane_url, mask_password
from syncd.addresses import check_proxy_url as check_proxy_url
from syncd.addresses import is_loopback_host as is_loopback_host
from syncd.addresses import local_url as local_url
from syncd.addresses import parse_listen as parse_listen
from syncd.hub.dsn import check_store
from syncd.places import APP_NAME as APP_NAME
from syncd.places import CONFIG_FILE_NAME as CONFIG_FILE_NAME
from syncd.places import ENV_PREFIX as ENV_PREFIX
from syncd.places import default_config_path as default_config_path
from syncd.places import default_data_dir as default_data_dir
from syncd.places import default_hub_data_dir as default_hub_data_dir
from syncd.places import expand_path as expand_path
from syncd.places import has_control_characters as has_control_characters

LogLevel = Literal["debug", "info", "warning", "error"]
EmbeddingModel = Literal["all-MiniLM-L6-v2", "hashing", "bge-small-en-v1.5"]
HubCursor = Literal["ingest", "origin"]
PrivateMemories = Literal["auto", "push", "local"]

MiB = 1024 * 1024

# Optional options (unix_socket, cache_dir, threads, url, token_file, realm, license_file) default
# to None, meaning "unset"; daemon.data_dir's default depends on the platform: default_data_dir().
DEFAULT_LISTEN = "127.0.0.1:7777"
DEFAULT_ALLOW_NON_LOOPBACK = False
DEFAULT_ALLOWED_HOSTS: tuple[str, ...] = ()
DEFAULT_MAX_BODY_BYTES = 4 * MiB
DEFAULT_SHUTDOWN_TIMEOUT_SECS = 10.0
DEFAULT_LOG_LEVEL: LogLevel = "info"
# Periods (intervals, windows, timeouts) are at most a year: the scheduler's date arithmetic
# overflowed on 1e12 s, and the daemon then exited 75 (try again) on a value that never works.
MAX_PERIOD_SECS = 365 * 86400.0
DEFAULT_EMBEDDING_MODEL: EmbeddingModel = "all-MiniLM-L6-v2"
DEFAULT_EMBEDDING_IDLE_UNLOAD_SECS = 600.0  # the model's ~100 MB go back after 10 idle minutes
DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL = "bge-small-en-v1.5"
DEFAULT_SYNC_INTERVAL_SECS = 30.0
DEFAULT_SYNC_JITTER = 0.1
DEFAULT_SYNC_OVERLAP_SECS = 120.0
DEFAULT_SYNC_PUSH_BATCH_BYTES = 3 * MiB // 2  # the plane's body limit is about 2 MiB
DEFAULT_SYNC_ANTI_ENTROPY_SECS = 3600.0
DEFAULT_ENTITLEMENT_PUBLIC_KEYS: tuple[str, ...] = ()
DEFAULT_ENTITLEMENT_REFRESH_SECS = 3600.0
DEFAULT_VERSIONS_KEEP = 20  # earlier versions kept per memory (local_store/versions.py)
DEFAULT_VERSIONS_MAX_AGE_DAYS = 180.0
DEFAULT_HUB_LISTEN = "127.0.0.1:8787"
DEFAULT_HUB_CURSOR: HubCursor = "ingest"
DEFAULT_HUB_TOKEN_LIFETIME_DAYS = 7.0
DEFAULT_HUB_REEMBED_SECS = 30.0
DEFAULT_MCP_AUTOSTART = True
DEFAULT_MCP_START_TIMEOUT_SECS = 20.0  # under the 30-60 s an MCP client gives a tool call


# --- errors -------------------------------------------------------------------------------------

_NO_VALUE: Any = object()


class ConfigError(Exception):
    """A configuration problem; ``str()`` is the whole message, e.g.
    ``config error: sync.interval_secs = -5: must be > 0 (from /etc/syncd.toml)``.

    ``field`` is the dotted option (None for file-level problems such as bad TOML), ``value`` the
    bad value as written, ``source`` the file or ``environment SYNCD_…`` it came from."""

    def __init__(self, reason: str, *, field: str | None = None, value: Any = _NO_VALUE,
                 source: str | None = None) -> None:
        self.reason, self.field, self.value, self.source = reason, field, value, source
        super().__init__(str(self))

    def __str__(self) -> str:
        where = "" if self.field is None else f"{self.field}: "
        if self.field is not None and self.value is not _NO_VALUE:
            shown = _show(self.value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            where = f"{self.field} = {shown}: "
        origin = "" if self.source is None else f" (from {self.source})"
        return f"config error: {where}{self.reason}{origin}"

    def located(self, source: str, value: Any = _NO_VALUE) -> ConfigError:
        """The same error, attributed to ``source`` (and to ``value`` as written there)."""
        shown = self.value if value is _NO_VALUE else value
        return ConfigError(self.reason, field=self.field, value=shown, source=source)


def _show(value: Any) -> str:
    """A value the way TOML would write it, with any URL's password masked."""
    if isinstance(value, str | Path):
        return json.dumps(mask_password(str(value)), ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_show(v)}" for k, v in value.items()) + "}"
    return str(value)


# --- sections -----------------------------------------------------------------------------------

class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One ``[section]`` of the file. Subclasses set ``SECTION`` and check themselves."""

    SECTION: ClassVar[str] = ""

    def _error(self, name: str, value: Any, reason: str) -> ConfigError:
        return ConfigError(reason, field=f"{self.SECTION}.{name}", value=value)

    def _check(self, name: str, ok: bool, reason: str) -> None:
        if not ok:
            raise self._error(name, getattr(self, name), reason)

    def _check_number(self, name: str, *, low: float, strict: bool = False,
                      high: float | None = None) -> None:
        value = getattr(self, name)
        if high is not None:
            ok = math.isfinite(value) and low <= value <= high
            self._check(name, ok, f"must be between {low:g} and {high:g}")
        elif strict:
            self._check(name, math.isfinite(value) and value > low, f"must be > {low:g}")
        else:
            self._check(name, math.isfinite(value) and value >= low, f"must be >= {low:g}")

    def _check_period(self, name: str, *, strict: bool = False) -> None:
        """A number of seconds: >= 0 (> 0 when ``strict``) and at most a year."""
        self._check_number(name, low=0, strict=strict)
        self._check(name, getattr(self, name) <= MAX_PERIOD_SECS,
                    f"must be at most {MAX_PERIOD_SECS:g} (a year)")

    def _check_path(self, name: str) -> None:
        value = getattr(self, name)
        if value is not None:
            self._check(name, value.is_absolute(), "must be an absolute path (or start with ~)")
            # A NUL made the daemon fail at start with exit 75 (try again, forever); a newline
            # would break the service unit the path is written into.
            self._check(name, not has_control_characters(str(value)),
                        "must not contain control characters (NUL, newline, tab, ...)")

    def _check_text(self, name: str) -> None:
        value = getattr(self, name)
        if value is not None:
            self._check(name, value.strip() != "", "must not be empty")


class DaemonConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[daemon]``: the local process and its HTTP API."""

    SECTION: ClassVar[str] = "daemon"
    data_dir: Path = msgspec.field(default_factory=default_data_dir)
    listen: str = DEFAULT_LISTEN
    unix_socket: Path | None = None
    allow_non_loopback: bool = DEFAULT_ALLOW_NON_LOOPBACK
    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    shutdown_timeout_secs: float = DEFAULT_SHUTDOWN_TIMEOUT_SECS
    log_level: LogLevel = DEFAULT_LOG_LEVEL

    def __post_init__(self) -> None:
        self._check_path("data_dir")
        self._check_path("unix_socket")
        try:
            host, _ = parse_listen(self.listen)
        except ValueError as exc:
            raise self._error("listen", self.listen, str(exc)) from None
        self._check("listen", self.allow_non_loopback or is_loopback_host(host),
                    f"{host} is not a loopback address; set daemon.allow_non_loopback = true "
                    "to accept connections from other machines")
        hosts = tuple(h.lower() for h in self.allowed_hosts)
        for i, name in enumerate(hosts):
            bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
            try:
                check_host(bare)
            except ValueError as exc:
                raise self._error(f"allowed_hosts[{i}]", self.allowed_hosts[i],
                                  f"{exc} (give host names without a port)") from None
        msgspec.structs.force_setattr(self, "allowed_hosts", hosts)
        self._check_number("max_body_bytes", low=1)
        self._check_period("shutdown_timeout_secs")
        if self.unix_socket is not None:  # sun_path: 108 bytes on Linux, 104 on macOS, with NUL
            room = 103 if sys.platform == "darwin" else 107
            self._check("unix_socket", len(os.fsencode(self.unix_socket)) <= room,
                        f"must be at most {room} bytes long (the operating system's limit for "
                        "a socket path)")


class EmbeddingConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[embedding]``: the local embedder."""

    SECTION: ClassVar[str] = "embedding"
    model: EmbeddingModel = DEFAULT_EMBEDDING_MODEL
    cache_dir: Path | None = None
    threads: int | None = None
    idle_unload_secs: float = DEFAULT_EMBEDDING_IDLE_UNLOAD_SECS

    def __post_init__(self) -> None:
        self._check_path("cache_dir")
        self._check_period("idle_unload_secs")
        if self.model == "bge-small-en-v1.5" and self.cache_dir is None:
            raise self._error("cache_dir", _NO_VALUE, f'required when embedding.model = "{self.model}" '
                              "(syncd never downloads models; it loads them from there)")
        if self.threads is not None:
            self._check_number("threads", low=1)


class ControlPlaneConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[control_plane]``: the Kyma-compatible plane this daemon syncs with (unset = no sync)."""

    SECTION: ClassVar[str] = "control_plane"
    url: str | None = None
    token_file: Path | None = None
    realm: str | None = None
    embedding_model: str = DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL
    # The HTTP proxy to reach the plane through; wins over HTTPS_PROXY/HTTP_PROXY/NO_PROXY.
    # Unset: those variables decide (syncd.sync.proxy), as they do for curl and pip.
    proxy: str | None = None
    # Whether `private:<agent>` memories go to the plane: "auto" only to one that returns a
    # memory's space (a syncd hub; Kyma's changes and export drop it, so other laptops would get
    # them public), "push" always, "local" never (docs/plane-vectors.md has its neighbour rule).
    private_memories: PrivateMemories = "auto"

    def __post_init__(self) -> None:
        if self.url is not None:
            try:
                msgspec.structs.force_setattr(self, "url", check_plane_url(self.url))
            except ValueError as exc:
                raise self._error("url", self.url, str(exc)) from None
        if self.proxy is not None:
            try:
                msgspec.structs.force_setattr(self, "proxy", check_proxy_url(self.proxy))
            except ValueError as exc:
                raise self._error("proxy", self.proxy, str(exc)) from None
        self._check_path("token_file")
        self._check_text("realm")
        self._check_text("embedding_model")


class SyncConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[sync]``: the sync loop's schedule and batch sizes."""

    SECTION: ClassVar[str] = "sync"
    interval_secs: float = DEFAULT_SYNC_INTERVAL_SECS
    jitter: float = DEFAULT_SYNC_JITTER
    overlap_secs: float = DEFAULT_SYNC_OVERLAP_SECS
    push_batch_bytes: int = DEFAULT_SYNC_PUSH_BATCH_BYTES
    anti_entropy_secs: float = DEFAULT_SYNC_ANTI_ENTROPY_SECS
    long_poll: bool = True  # hold changes?wait= on a hub that offers it (docs/long-poll.md)

    def __post_init__(self) -> None:
        self._check_period("interval_secs", strict=True)
        self._check_number("jitter", low=0, high=1)
        self._check_period("overlap_secs")
        self._check_number("push_batch_bytes", low=1)
        self._check_period("anti_entropy_secs", strict=True)


class VersionsConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[versions]``: how much history of each memory this replica keeps (docs/versions.md)."""

    SECTION: ClassVar[str] = "versions"
    keep: int = DEFAULT_VERSIONS_KEEP
    max_age_days: float = DEFAULT_VERSIONS_MAX_AGE_DAYS

    def __post_init__(self) -> None:
        self._check_number("keep", low=0, high=10_000)
        self._check_number("max_age_days", low=0, high=36_500)


class EntitlementConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[entitlement]``: the pinned keys that verify entitlement tokens and licences."""

    SECTION: ClassVar[str] = "entitlement"
    public_keys: tuple[str, ...] = DEFAULT_ENTITLEMENT_PUBLIC_KEYS
    license_file: Path | None = None
    refresh_secs: float = DEFAULT_ENTITLEMENT_REFRESH_SECS

    def __post_init__(self) -> None:
        for i, key in enumerate(self.public_keys):
            if not key or any(c.isspace() for c in key):
                raise self._error(f"public_keys[{i}]", key, "must be non-empty, without spaces")
        self._check_path("license_file")
        self._check_period("refresh_secs", strict=True)


class HubConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[hub]``: ``syncd hub``, the reference control plane (meant to be reached by other
    machines, so it may listen on any address)."""

    SECTION: ClassVar[str] = "hub"
    data_dir: Path = msgspec.field(default_factory=default_hub_data_dir)
    listen: str = DEFAULT_HUB_LISTEN
    cursor: HubCursor = DEFAULT_HUB_CURSOR
    token_lifetime_days: float = DEFAULT_HUB_TOKEN_LIFETIME_DAYS
    # "sqlite" (in data_dir) or a postgresql:// DSN; store_file names a 0600 file holding the
    # DSN instead, so the password stays out of the config (syncd/hub/dsn.py).
    store: str = "sqlite"
    store_file: Path | None = None
    reembed_secs: float = DEFAULT_HUB_REEMBED_SECS  # 0: never embed pushed rows at the hub
    max_held_polls: int = 500  # long-polls held at once per process (docs/long-poll.md)

    def __post_init__(self) -> None:
        try:
            parse_listen(self.listen)
        except ValueError as exc:
            raise self._error("listen", self.listen, str(exc)) from None
        try:
            dsn = check_store(self.store)
        except ValueError as exc:
            raise self._error("store", self.store.split("://", 1)[0], str(exc)) from None
        if dsn is not None and self.store_file is not None:
            raise self._error("store_file", str(self.store_file),
                              "set either store (a DSN) or store_file, not both")
        self._check_path("data_dir")
        self._check_path("store_file")
        self._check_number("token_lifetime_days", low=0, strict=True)
        self._check("token_lifetime_days", self.token_lifetime_days <= 3650,
                    "must be at most 3650 (ten years)")
        self._check_period("reembed_secs")
        self._check_number("max_held_polls", low=0)


class McpConfig(_Section, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[mcp]``: ``syncd mcp``, the stdio server an agent launches (syncd/autostart.py)."""

    SECTION: ClassVar[str] = "mcp"
    autostart: bool = DEFAULT_MCP_AUTOSTART
    start_timeout_secs: float = DEFAULT_MCP_START_TIMEOUT_SECS

    def __post_init__(self) -> None:
        self._check_period("start_timeout_secs", strict=True)


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """The whole configuration. Build it with ``load_config``/``parse_config``, or directly in
    tests (``Config(daemon=DaemonConfig(data_dir=tmp_path, listen="127.0.0.1:0"))``)."""

    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    embedding: EmbeddingConfig = msgspec.field(default_factory=EmbeddingConfig)
    control_plane: ControlPlaneConfig = msgspec.field(default_factory=ControlPlaneConfig)
    sync: SyncConfig = msgspec.field(default_factory=SyncConfig)
    versions: VersionsConfig = msgspec.field(default_factory=VersionsConfig)
    entitlement: EntitlementConfig = msgspec.field(default_factory=EntitlementConfig)
    hub: HubConfig = msgspec.field(default_factory=HubConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)


SECTIONS: dict[str, type[_Section]] = {
    f.name: f.type for f in msgspec.structs.fields(Config)
}
# Field types for environment conversion and error messages: {section: {field: type}}.
_TYPES: dict[str, dict[str, mi.Type]] = {
    name: {f.name: f.type for f in info.fields}
    for name, cls in SECTIONS.items()
    if isinstance(info := mi.type_info(cls), mi.StructType)
}


# --- loading ------------------------------------------------------------------------------------

def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> Config:
    """Load ``path`` (it must exist), or with None the default config file if there is one,
    else the defaults; then apply ``env``'s ``SYNCD_*`` overrides."""
    if path is None:
        path = default_config_path(env)
        if not path.exists():
            return parse_config(b"", source="defaults", env=env)
    path = expand_path(str(path), env)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", source=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", source=str(path)) from None
    return parse_config(data, source=str(path), env=env)


def parse_config(data: bytes, *, source: str = "<config>",
                 env: Mapping[str, str] | None = None) -> Config:
    """Decode TOML ``data``, apply ``SYNCD_*`` overrides from ``env``, validate.

    ``env`` is also where HOME and XDG_* come from for ``~`` and the default data_dir; None means
    an empty environment (no overrides), which keeps tests hermetic."""
    env = {} if env is None else env
    try:
        raw = tomllib.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ConfigError("the file is not UTF-8 text", source=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", source=source) from None
    from_env = _apply_env(raw, env)
    daemon = raw.setdefault("daemon", {})
    if isinstance(daemon, dict):
        daemon.setdefault("data_dir", str(default_data_dir(env)))
    hub = raw.setdefault("hub", {})
    if isinstance(hub, dict):
        hub.setdefault("data_dir", str(default_hub_data_dir(env)))
    try:
        try:
            return msgspec.convert(raw, Config, dec_hook=_path_hook(env))
        except msgspec.ValidationError as exc:
            raise _from_validation_error(str(exc)) from None
    except ConfigError as exc:
        raise _locate(exc, raw, from_env, source) from None


def _path_hook(env: Mapping[str, str]) -> Callable[[type, Any], Any]:
    def hook(kind: type, value: Any) -> Any:
        if kind is Path and isinstance(value, str):
            return expand_path(value, env)
        if kind is Path:
            raise ValueError(f"expected a path string, got {type(value).__name__}")
        raise NotImplementedError(kind)
    return hook


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Fold ``SYNCD_<SECTION>_<FIELD>`` into ``raw``; returns ``{field: (var, text)}``."""
    applied: dict[str, tuple[str, str]] = {}
    for var in sorted(env):
        section = next((s for s in SECTIONS if var.startswith(_env_prefix(s))), None)
        if section is None:
            continue  # not config-shaped (e.g. SYNCD_CONFIG is the CLI's business)
        text, name = env[var], var[len(_env_prefix(section)):].lower()
        if name not in _TYPES[section] or var != _env_var(section, name):
            guess = difflib.get_close_matches(name, _TYPES[section], n=1)
            hint = f"; did you mean {_env_var(section, guess[0])}?" if guess else ""
            raise ConfigError(f"names no option in [{section}]{hint}", field=var, value=text,
                              source="environment")
        field = f"{section}.{name}"
        try:
            value = _from_env_text(_TYPES[section][name], text)
        except ValueError as exc:
            raise ConfigError(str(exc), field=field, value=text,
                              source=f"environment {var}") from None
        table = raw.setdefault(section, {})
        if isinstance(table, dict):  # else the section is malformed; convert() reports it
            table[name] = value
            applied[field] = (var, text)
    return applied


def _env_prefix(section: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}_"


def _env_var(section: str, name: str) -> str:
    return _env_prefix(section) + name.upper()


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _from_env_text(kind: mi.Type, text: str) -> Any:
    """An environment string as the TOML value it stands for; ValueError when it cannot be."""
    if isinstance(kind, mi.UnionType):  # an optional option: empty means unset
        if text == "":
            return None
        kind = next(t for t in kind.types if not isinstance(t, mi.NoneType))
    if isinstance(kind, mi.BoolType):
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ValueError("expected true or false (also 1/0, yes/no, on/off)")
    if isinstance(kind, mi.IntType):
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected an integer") from None
    if isinstance(kind, mi.FloatType):
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None
    if isinstance(kind, mi.VarTupleType | mi.ListType):
        return [item.strip() for item in text.split(",") if item.strip()]
    return text  # str, a Literal choice, or a path: convert() checks and expands it


_AT = re.compile(r"(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_EXPECTED = re.compile(r"Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`")
_KINDS = {"object": "a table", "array": "an array", "str": "a string", "int": "an integer",
          "float": "a number", "bool": "true or false", "Path": "a path string"}


def _from_validation_error(text: str) -> ConfigError:
    """msgspec's ``<message> - at `$.sync.interval_secs``` → a ConfigError for that field."""
    match = _AT.fullmatch(text)
    assert match is not None  # the pattern matches any string
    message, path = match["message"], (match["path"] or "").lstrip(".")
    if unknown := _UNKNOWN.fullmatch(message):
        name = unknown["name"]
        return ConfigError(_unknown_reason(path, name), field=f"{path}.{name}".lstrip("."))
    if expected := _EXPECTED.fullmatch(message):
        wants = [_KINDS.get(w, w) for w in expected["want"].split(" | ") if w != "null"]
        got = _KINDS.get(expected["got"], expected["got"])
        return ConfigError(f"expected {' or '.join(wants)}, got {got}", field=path)
    if message.startswith("Invalid enum value"):
        section, _, name = path.partition(".")
        kind = _TYPES.get(section, {}).get(name)
        if isinstance(kind, mi.LiteralType):
            return ConfigError("must be one of " + ", ".join(_show(v) for v in kind.values),
                               field=path)
    return ConfigError(message, field=path or None)


def _unknown_reason(section: str, name: str) -> str:
    if section:
        guess = difflib.get_close_matches(name, _TYPES.get(section, {}), n=1)
        hint = f"; did you mean {guess[0]}?" if guess else ""
        return f"unknown option in [{section}]{hint}"
    guess = difflib.get_close_matches(name, SECTIONS, n=1)
    homes = [s for s, fields in _TYPES.items() if name in fields]
    hint = (f"; did you mean [{guess[0]}]?" if guess
            else f"; {name} belongs under [{homes[0]}]" if homes else "")
    return f"unknown section (sections: {', '.join(SECTIONS)}){hint}"


def _locate(error: ConfigError, raw: dict[str, Any], from_env: dict[str, tuple[str, str]],
            source: str) -> ConfigError:
    """Attribute ``error`` to the environment variable or file its field came from."""
    if error.source is not None:
        return error
    field = error.field or ""
    option = re.sub(r"\[\d+\]$", "", field)
    if option in from_env:
        var, text = from_env[option]
        return error.located(f"environment {var}", text)
    value: Any = raw
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", field):
        if part.startswith("[") and isinstance(value, list) and int(part[1:-1]) < len(value):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return error.located(source)
    return error.located(source, value) if field else error.located(source)
