"""syncd.config: the example file is the defaults and documents every option; env overrides;
every error names the field, the bad value and where it came from."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from local_store.embed_minilm import BGE_MODEL_ID, MINILM_MODEL_ID
from syncd.addresses import is_loopback_host, parse_listen
from syncd.config import (
    DEFAULT_ALLOW_NON_LOOPBACK,
    DEFAULT_ALLOWED_HOSTS,
    DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL,
    DEFAULT_EMBEDDING_IDLE_UNLOAD_SECS,
    DEFAULT_EMBEDDING_MODEL,
    DEFAULT_ENTITLEMENT_PUBLIC_KEYS,
    DEFAULT_ENTITLEMENT_REFRESH_SECS,
    DEFAULT_HUB_CURSOR,
    DEFAULT_HUB_LISTEN,
    DEFAULT_HUB_TOKEN_LIFETIME_DAYS,
    DEFAULT_LISTEN,
    DEFAULT_LOG_LEVEL,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SHUTDOWN_TIMEOUT_SECS,
    DEFAULT_SYNC_ANTI_ENTROPY_SECS,
    DEFAULT_SYNC_INTERVAL_SECS,
    DEFAULT_SYNC_JITTER,
    DEFAULT_SYNC_OVERLAP_SECS,
    DEFAULT_SYNC_PUSH_BATCH_BYTES,
    SECTIONS,
    Config,
    ConfigError,
    ControlPlaneConfig,
    DaemonConfig,
    EmbeddingConfig,
    HubConfig,
    default_config_path,
    default_data_dir,
    load_config,
    parse_config,
)
from syncd.places import default_cache_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "syncd.example.toml"
HOME = "/home/ada"
ENV = {"HOME": HOME}


def _example_sections() -> dict[str, list[str]]:
    """The example file's lines, grouped by ``[section]``."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in EXAMPLE.read_text().splitlines():
        if header := re.fullmatch(r"\[(\w+)\]", line):
            current = header[1]
            sections[current] = []
        else:
            sections[current].append(line)
    return sections


def _error(data: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(data.encode(), source="/etc/syncd/config.toml", env={**ENV, **(env or {})})
    return caught.value


# --- the example file ---------------------------------------------------------------------------

def test_example_decodes_to_the_defaults() -> None:
    parsed = parse_config(EXAMPLE.read_bytes(), source=str(EXAMPLE), env=ENV)
    defaults = Config(daemon=DaemonConfig(data_dir=Path(HOME, ".local/share/syncd")),
                      hub=HubConfig(data_dir=Path(HOME, ".local/share/syncd-hub")))
    assert parsed == parse_config(b"", env=ENV) == defaults


def test_example_documents_every_option_of_every_section_with_a_comment() -> None:
    sections = _example_sections()
    assert set(sections) - {""} == set(SECTIONS)
    for section, cls in SECTIONS.items():
        lines = sections[section]
        for field in msgspec.structs.fields(cls):
            found = [i for i, line in enumerate(lines)
                     if re.match(rf"(# )?{field.name} = ", line)]
            assert found, f"{section}.{field.name} is missing from {EXAMPLE.name}"
            above = lines[found[0] - 1]
            assert above.startswith("# ") and not re.match(r"# \w+ = ", above), (
                f"{section}.{field.name} has no explanatory comment above it")


def test_example_sets_each_option_with_a_fixed_default_and_comments_out_the_rest() -> None:
    """An option with a fixed default is set to it; one unset by default (``None``) or whose
    default depends on the platform (a factory) is shown commented out, as the header says."""
    for section, cls in SECTIONS.items():
        lines = _example_sections()[section]
        for field in msgspec.structs.fields(cls):
            commented = any(line.startswith(f"# {field.name} = ") for line in lines)
            unset = field.default is None or field.default is msgspec.NODEFAULT
            assert commented == unset, (
                f"{section}.{field.name}: {'commented out' if commented else 'set'} in "
                f"{EXAMPLE.name}, but its default is {field.default!r}")


def test_example_names_no_option_that_does_not_exist() -> None:
    for section, lines in _example_sections().items():
        names = {m[1] for line in lines if (m := re.match(r"(?:# )?(\w+) = ", line))}
        known = {f.name for f in msgspec.structs.fields(SECTIONS[section])} if section else set()
        assert names <= known, f"[{section}] documents unknown options {names - known}"


def test_example_values_of_commented_options_are_valid() -> None:
    uncommented = re.sub(r"(?m)^# (\w+ = )", r"\1", EXAMPLE.read_text())
    config = parse_config(uncommented.encode(), env=ENV)
    assert config.daemon.unix_socket == Path(HOME, ".local/share/syncd/syncd.sock")
    assert config.control_plane.url == "https://plane.example.com"
    assert config.embedding.threads == 2
    assert config.entitlement.license_file is not None


# --- defaults -----------------------------------------------------------------------------------

def test_defaults() -> None:
    config = parse_config(b"", env=ENV)
    assert config.daemon == DaemonConfig(
        data_dir=Path(HOME, ".local/share/syncd"), listen="127.0.0.1:7777", unix_socket=None,
        allow_non_loopback=False, allowed_hosts=(), max_body_bytes=4 * 1024 * 1024,
        shutdown_timeout_secs=10.0, log_level="info")
    assert (DEFAULT_LISTEN, DEFAULT_ALLOW_NON_LOOPBACK, DEFAULT_ALLOWED_HOSTS) == (
        "127.0.0.1:7777", False, ())
    assert (DEFAULT_MAX_BODY_BYTES, DEFAULT_SHUTDOWN_TIMEOUT_SECS, DEFAULT_LOG_LEVEL) == (
        4 * 1024 * 1024, 10.0, "info")
    assert (config.embedding.model, config.embedding.cache_dir, config.embedding.threads) == (
        DEFAULT_EMBEDDING_MODEL, None, None)
    assert config.embedding.idle_unload_secs == DEFAULT_EMBEDDING_IDLE_UNLOAD_SECS == 600.0
    assert config.control_plane == ControlPlaneConfig(
        url=None, token_file=None, realm=None,
        embedding_model=DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL, private_memories="auto")
    assert (config.sync.interval_secs, config.sync.jitter, config.sync.overlap_secs,
            config.sync.push_batch_bytes, config.sync.anti_entropy_secs) == (
        DEFAULT_SYNC_INTERVAL_SECS, DEFAULT_SYNC_JITTER, DEFAULT_SYNC_OVERLAP_SECS,
        DEFAULT_SYNC_PUSH_BATCH_BYTES, DEFAULT_SYNC_ANTI_ENTROPY_SECS) == (
        30.0, 0.1, 120.0, 1_572_864, 3600.0)
    assert (config.entitlement.public_keys, config.entitlement.license_file,
            config.entitlement.refresh_secs) == (
        DEFAULT_ENTITLEMENT_PUBLIC_KEYS, None, DEFAULT_ENTITLEMENT_REFRESH_SECS) == (
        (), None, 3600.0)
    assert (config.hub.listen, config.hub.cursor, config.hub.token_lifetime_days) == (
        DEFAULT_HUB_LISTEN, DEFAULT_HUB_CURSOR, DEFAULT_HUB_TOKEN_LIFETIME_DAYS) == (
        "127.0.0.1:8787", "ingest", 7.0)


def test_embedding_model_names_are_the_embedders_ids() -> None:
    assert DEFAULT_EMBEDDING_MODEL == MINILM_MODEL_ID
    assert DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL == BGE_MODEL_ID
    bge = parse_config(b'[embedding]\nmodel = "bge-small-en-v1.5"\ncache_dir = "/m"', env=ENV)
    assert bge.embedding.model == BGE_MODEL_ID


@pytest.mark.parametrize(("env", "platform", "data_dir", "config_path"), [
    ({"HOME": HOME}, "linux", f"{HOME}/.local/share/syncd", f"{HOME}/.config/syncd/config.toml"),
    ({"HOME": HOME, "XDG_DATA_HOME": "/xd", "XDG_CONFIG_HOME": "/xc"}, "linux",
     "/xd/syncd", "/xc/syncd/config.toml"),
    # The XDG spec says a relative value is invalid and must be ignored.
    ({"HOME": HOME, "XDG_DATA_HOME": "rel", "XDG_CONFIG_HOME": "rel"}, "linux",
     f"{HOME}/.local/share/syncd", f"{HOME}/.config/syncd/config.toml"),
    ({"HOME": HOME, "XDG_DATA_HOME": "/xd"}, "darwin",
     f"{HOME}/Library/Application Support/syncd",
     f"{HOME}/Library/Application Support/syncd/config.toml"),
])
def test_platform_default_paths(env: dict[str, str], platform: str, data_dir: str,
                                config_path: str) -> None:
    assert default_data_dir(env, platform) == Path(data_dir)
    assert default_config_path(env, platform) == Path(config_path)


@pytest.mark.parametrize(("env", "platform", "cache_dir"), [
    ({"HOME": HOME}, "linux", f"{HOME}/.cache/syncd"),
    ({"HOME": HOME, "XDG_CACHE_HOME": "/xcache"}, "linux", "/xcache/syncd"),
    ({"HOME": HOME, "XDG_CACHE_HOME": "rel"}, "linux", f"{HOME}/.cache/syncd"),
    ({"HOME": HOME, "XDG_CACHE_HOME": "/xcache"}, "darwin", f"{HOME}/Library/Caches/syncd"),
])
def test_platform_default_cache_dir(env: dict[str, str], platform: str, cache_dir: str) -> None:
    assert default_cache_dir(env, platform) == Path(cache_dir)


def test_config_is_frozen_and_checked_when_built_or_replaced_in_code() -> None:
    config = parse_config(b"", env=ENV)
    with pytest.raises(AttributeError):
        config.daemon.listen = "127.0.0.1:1"  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"daemon\.listen = \"0\.0\.0\.0:1\""):
        msgspec.structs.replace(config.daemon, listen="0.0.0.0:1")
    with pytest.raises(ConfigError, match=r"embedding\.threads = 0: must be >= 1"):
        EmbeddingConfig(threads=0)


def test_paths_expand_tilde_and_urls_lose_their_trailing_slash() -> None:
    config = parse_config(
        b'[daemon]\ndata_dir = "~/d"\nallowed_hosts = ["MyBox.lan", "[fe80::1]"]\n'
        b'[control_plane]\nurl = "http://[::1]:8787/plane/"\ntoken_file = "~/t"\n', env=ENV)
    assert config.daemon.data_dir == Path(HOME, "d")
    assert config.daemon.allowed_hosts == ("mybox.lan", "[fe80::1]")
    assert config.control_plane.url == "http://[::1]:8787/plane"
    assert config.control_plane.token_file == Path(HOME, "t")


# --- environment overrides ----------------------------------------------------------------------

@pytest.mark.parametrize(("var", "text", "section", "field", "expected"), [
    ("SYNCD_DAEMON_LISTEN", "127.0.0.1:0", "daemon", "listen", "127.0.0.1:0"),
    ("SYNCD_CONTROL_PLANE_REALM", "work", "control_plane", "realm", "work"),
    ("SYNCD_DAEMON_MAX_BODY_BYTES", "1024", "daemon", "max_body_bytes", 1024),
    ("SYNCD_EMBEDDING_THREADS", "3", "embedding", "threads", 3),
    ("SYNCD_EMBEDDING_IDLE_UNLOAD_SECS", "0", "embedding", "idle_unload_secs", 0.0),
    ("SYNCD_SYNC_INTERVAL_SECS", "0.5", "sync", "interval_secs", 0.5),
    ("SYNCD_SYNC_PUSH_BATCH_BYTES", "2_000", "sync", "push_batch_bytes", 2000),
    ("SYNCD_DAEMON_ALLOW_NON_LOOPBACK", "true", "daemon", "allow_non_loopback", True),
    ("SYNCD_DAEMON_ALLOW_NON_LOOPBACK", "Yes", "daemon", "allow_non_loopback", True),
    ("SYNCD_DAEMON_ALLOW_NON_LOOPBACK", "0", "daemon", "allow_non_loopback", False),
    ("SYNCD_ENTITLEMENT_PUBLIC_KEYS", "k1:abc, k2:def,", "entitlement", "public_keys",
     ("k1:abc", "k2:def")),
    ("SYNCD_ENTITLEMENT_PUBLIC_KEYS", "", "entitlement", "public_keys", ()),
    ("SYNCD_DAEMON_DATA_DIR", "~/elsewhere", "daemon", "data_dir", Path(HOME, "elsewhere")),
    ("SYNCD_DAEMON_UNIX_SOCKET", "/run/syncd.sock", "daemon", "unix_socket",
     Path("/run/syncd.sock")),
    ("SYNCD_HUB_CURSOR", "origin", "hub", "cursor", "origin"),
    ("SYNCD_DAEMON_LOG_LEVEL", "debug", "daemon", "log_level", "debug"),
])
def test_env_overrides_each_type(var: str, text: str, section: str, field: str,
                                 expected: Any) -> None:
    config = parse_config(b"", env={**ENV, var: text})
    assert getattr(getattr(config, section), field) == expected


def test_env_wins_over_the_file_and_empty_unsets_an_optional_option() -> None:
    data = b'[sync]\ninterval_secs = 60\n[daemon]\nunix_socket = "/run/a.sock"\n'
    config = parse_config(data, env={**ENV, "SYNCD_SYNC_INTERVAL_SECS": "5",
                                     "SYNCD_DAEMON_UNIX_SOCKET": ""})
    assert config.sync.interval_secs == 5.0
    assert config.daemon.unix_socket is None


def test_env_vars_that_are_not_config_shaped_are_ignored() -> None:
    env = {**ENV, "SYNCD_CONFIG": "/x", "SYNCD_SYNCHRONOUS": "1", "SYNCD_DAEMON": "x",
           "XDG_RUNTIME_DIR": "/run/user/1", "syncd_daemon_listen": "nope"}
    assert parse_config(b"", env=env) == parse_config(b"", env=ENV)


def test_parse_config_without_env_ignores_the_process_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCD_DAEMON_LISTEN", "127.0.0.1:1")
    assert parse_config(b"").daemon.listen == DEFAULT_LISTEN


# --- errors name the field, the value and the source --------------------------------------------

def test_error_message_form() -> None:
    error = _error("[sync]\ninterval_secs = -5\n")
    assert str(error) == (
        "config error: sync.interval_secs = -5: must be > 0 (from /etc/syncd/config.toml)")
    assert (error.field, error.value, error.reason, error.source) == (
        "sync.interval_secs", -5, "must be > 0", "/etc/syncd/config.toml")


@pytest.mark.parametrize(("data", "env", "expected"), [
    # wrong types
    ('[sync]\ninterval_secs = "soon"', {},
     'sync.interval_secs = "soon": expected a number, got a string'),
    ("[daemon]\nmax_body_bytes = 1.5", {},
     "daemon.max_body_bytes = 1.5: expected an integer, got a number"),
    ('[daemon]\nallow_non_loopback = "yes"', {},
     'daemon.allow_non_loopback = "yes": expected true or false, got a string'),
    ("[entitlement]\npublic_keys = [1]", {},
     "entitlement.public_keys[0] = 1: expected a string, got an integer"),
    ("[daemon]\nunix_socket = 5", {}, "daemon.unix_socket = 5: expected a path string"),
    ("sync = 5", {}, "sync = 5: expected a table, got an integer"),
    # ranges
    ("[sync]\ninterval_secs = 0", {}, "sync.interval_secs = 0: must be > 0"),
    ("[sync]\ninterval_secs = inf", {}, "sync.interval_secs = inf: must be > 0"),
    ("[sync]\njitter = 1.5", {}, "sync.jitter = 1.5: must be between 0 and 1"),
    ("[sync]\noverlap_secs = -1", {}, "sync.overlap_secs = -1: must be >= 0"),
    ("[embedding]\nthreads = 0", {}, "embedding.threads = 0: must be >= 1"),
    ("[embedding]\nidle_unload_secs = -1", {}, "embedding.idle_unload_secs = -1: must be >= 0"),
    ("[embedding]\nidle_unload_secs = 1e12", {},
     "embedding.idle_unload_secs = 1000000000000.0: must be at most 3.1536e+07 (a year)"),
    ("[embedding]\nidle_unload_secs = nan", {}, "embedding.idle_unload_secs = nan: must be >= 0"),
    ("[hub]\ntoken_lifetime_days = 0", {}, "hub.token_lifetime_days = 0: must be > 0"),
    ("[hub]\nreembed_secs = -1", {}, "hub.reembed_secs = -1: must be >= 0"),
    ("[hub]\nmax_held_polls = -1", {}, "hub.max_held_polls = -1: must be >= 0"),
    ('[hub]\nstore = "mysql://db/hub"', {},
     "hub.store = \"mysql://db/hub\": store: must be `sqlite` or a postgresql:// DSN"),
    ('[hub]\nstore = "postgresql://db/hub"\nstore_file = "/etc/dsn"', {},
     "hub.store_file = \"/etc/dsn\": set either store (a DSN) or store_file, not both"),
    # choices
    ('[daemon]\nlog_level = "verbose"', {}, 'daemon.log_level = "verbose": must be one of'),
    ('[hub]\ncursor = "wall"', {}, 'hub.cursor = "wall": must be one of "ingest", "origin"'),
    ('[control_plane]\nprivate_memories = "yes"', {},
     'control_plane.private_memories = "yes": must be one of "auto", "local", "push"'),
    ('[embedding]\nmodel = "bge-small-en-v1.5"', {},
     "embedding.cache_dir: required when embedding.model"),
    # urls, addresses, paths
    ('[control_plane]\nurl = "ftp://plane"', {},
     'control_plane.url = "ftp://plane": must be an http:// or https:// URL'),
    ('[control_plane]\nurl = "https://"', {}, 'control_plane.url = "https://": has no host'),
    ('[control_plane]\nurl = "https://u:pw@plane"', {}, "must not contain credentials"),
    ('[control_plane]\nurl = "https://plane:99999"', {}, "has an invalid port"),
    ('[control_plane]\nurl = "https://plane/x?y=1"', {}, "must not have a query"),
    ('[daemon]\nlisten = "localhost"', {}, 'daemon.listen = "localhost": expected host:port'),
    ('[daemon]\nlisten = "127.0.0.1:70000"', {}, "port '70000' is not a number"),
    ('[hub]\nlisten = "::1:8787"', {}, "an IPv6 address needs brackets"),
    ('[daemon]\nlisten = "0.0.0.0:7777"', {},
     'daemon.listen = "0.0.0.0:7777": 0.0.0.0 is not a loopback address; '
     "set daemon.allow_non_loopback = true"),
    ('[daemon]\nlisten = "[::]:7777"', {}, "is not a loopback address"),
    ('[daemon]\nlisten = "mybox.lan:7777"', {}, "mybox.lan is not a loopback address"),
    ('[daemon]\nallowed_hosts = ["mybox:7777"]', {},
     'daemon.allowed_hosts[0] = "mybox:7777": \'mybox:7777\' is not a valid host name'),
    ('[daemon]\ndata_dir = "relative/dir"', {},
     'daemon.data_dir = "relative/dir": must be an absolute path'),
    ('[control_plane]\nrealm = " "', {}, 'control_plane.realm = " ": must not be empty'),
    # typos
    ("[sync]\nintervl_secs = 5", {},
     "sync.intervl_secs = 5: unknown option in [sync]; did you mean interval_secs?"),
    ("[synk]\ninterval_secs = 5", {}, "synk = {interval_secs = 5}: unknown section"),
    ('listen = "127.0.0.1:1"', {}, "unknown section (sections: daemon, embedding"),
])
def test_file_errors_name_field_and_value(data: str, env: dict[str, str], expected: str) -> None:
    message = str(_error(data, env))
    assert message.startswith("config error: ")
    assert expected in message
    assert message.endswith("(from /etc/syncd/config.toml)")


def test_non_loopback_listen_is_allowed_when_asked_for() -> None:
    data = b'[daemon]\nlisten = "0.0.0.0:7777"\nallow_non_loopback = true\n'
    assert parse_config(data, env=ENV).daemon.listen == "0.0.0.0:7777"
    # The hub is meant to be reached by other machines.
    assert parse_config(b'[hub]\nlisten = "0.0.0.0:8787"', env=ENV).hub.listen == "0.0.0.0:8787"


@pytest.mark.parametrize(("env", "expected"), [
    ({"SYNCD_SYNC_INTERVAL_SECS": "soon"},
     'sync.interval_secs = "soon": expected a number (from environment SYNCD_SYNC_INTERVAL_SECS)'),
    ({"SYNCD_SYNC_INTERVAL_SECS": "-5"},
     'sync.interval_secs = "-5": must be > 0 (from environment SYNCD_SYNC_INTERVAL_SECS)'),
    ({"SYNCD_DAEMON_MAX_BODY_BYTES": "4MiB"},
     'daemon.max_body_bytes = "4MiB": expected an integer (from environment '
     "SYNCD_DAEMON_MAX_BODY_BYTES)"),
    ({"SYNCD_DAEMON_ALLOW_NON_LOOPBACK": "maybe"},
     'daemon.allow_non_loopback = "maybe": expected true or false'),
    ({"SYNCD_DAEMON_LISTEN": "0.0.0.0:7777"},
     'daemon.listen = "0.0.0.0:7777": 0.0.0.0 is not a loopback address'),
    ({"SYNCD_HUB_CURSOR": "wall"},
     'hub.cursor = "wall": must be one of "ingest", "origin" (from environment SYNCD_HUB_CURSOR)'),
    ({"SYNCD_DAEMON_LISTN": "127.0.0.1:1"},
     'config error: SYNCD_DAEMON_LISTN = "127.0.0.1:1": names no option in [daemon]; '
     "did you mean SYNCD_DAEMON_LISTEN? (from environment)"),
    ({"SYNCD_DAEMON_listen": "127.0.0.1:1"}, "SYNCD_DAEMON_listen"),
    ({"SYNCD_CONTROL_PLANE_TOKEN": "secret"}, "names no option in [control_plane]"),
])
def test_env_errors_name_the_variable_and_value(env: dict[str, str], expected: str) -> None:
    message = str(_error("", env))
    assert expected in message
    assert "(from environment" in message


def test_a_bad_file_value_overridden_by_env_is_not_reported() -> None:
    data = b"[sync]\ninterval_secs = -5\n"
    config = parse_config(data, env={**ENV, "SYNCD_SYNC_INTERVAL_SECS": "9"})
    assert config.sync.interval_secs == 9.0


@pytest.mark.parametrize(("data", "expected"), [
    (b"[sync\n", "config error: invalid TOML: "),
    (b"[daemon]\nlisten = \n", "config error: invalid TOML: "),
    (b"\xff\xfe[daemon]", "config error: the file is not UTF-8 text"),
])
def test_unreadable_toml_is_an_error_naming_the_source(data: bytes, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="/etc/syncd/config.toml", env=ENV)
    assert str(caught.value).startswith(expected)
    assert str(caught.value).endswith("(from /etc/syncd/config.toml)")



@pytest.mark.parametrize(("data", "field", "reason"), [
    (b"[sync]\ninterval_secs = 1e12\n", "sync.interval_secs", "must be at most 3.1536e+07"),
    (b"[sync]\nanti_entropy_secs = 1e20\n", "sync.anti_entropy_secs", "at most"),
    (b"[sync]\noverlap_secs = 1e9\n", "sync.overlap_secs", "at most"),
    (b"[entitlement]\nrefresh_secs = 1e10\n", "entitlement.refresh_secs", "at most"),
    (b"[hub]\nreembed_secs = 1e10\n", "hub.reembed_secs", "at most"),
    (b"[hub]\ntoken_lifetime_days = 1e6\n", "hub.token_lifetime_days", "at most 3650"),
    (b'[hub]\ndata_dir = "hubdata"\n', "hub.data_dir", "absolute path"),
    (b'[hub]\nstore_file = "dsn.txt"\n', "hub.store_file", "absolute path"),
    (b'[daemon]\nunix_socket = "/tmp/' + b"s" * 120 + b'.sock"\n', "daemon.unix_socket",
     "at most 107 bytes"),
    # a NUL failed at start with exit 75 (restarted forever); a newline broke the service unit
    (b'[daemon]\ndata_dir = "/srv/a\\u0000b"\n', "daemon.data_dir", "control characters"),
    (b'[daemon]\ndata_dir = "/srv/a\\nExecStartPre=/bin/true"\n', "daemon.data_dir",
     "control characters"),
    (b'[embedding]\ncache_dir = "/srv/\\u007f"\n', "embedding.cache_dir", "control characters"),
    (b'[hub]\nstore_file = "~/dsn\\t"\n', "hub.store_file", "control characters"),
])
def test_values_that_would_fail_later_are_refused_at_load(data: bytes, field: str,
                                                          reason: str) -> None:
    """A period beyond a year overflowed the scheduler's dates (and the daemon exited 75, "try
    again", forever); a relative hub path depended on the working directory (``/`` under
    systemd); a socket path beyond the OS limit failed at bind with no reason."""
    message = str(_error(data.decode()))
    assert message.startswith(f"config error: {field} = ") and reason in message, message


def test_long_values_are_shortened_in_messages() -> None:
    message = str(_error(f'[daemon]\nlisten = "{"x" * 200}"'))
    assert '"xxx' in message and '..."' not in message and "...: " in message
    assert len(message) < 200


# --- load_config --------------------------------------------------------------------------------

def test_load_config_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(f"file not found (from {missing})")):
        load_config(missing, env=ENV)


def test_load_config_reads_the_explicit_file_then_env(tmp_path: Path) -> None:
    path = tmp_path / "syncd.toml"
    path.write_text('[sync]\ninterval_secs = 60\n[hub]\ncursor = "origin"\n')
    config = load_config(path, env={**ENV, "SYNCD_SYNC_INTERVAL_SECS": "2"})
    assert (config.sync.interval_secs, config.hub.cursor) == (2.0, "origin")


def test_load_config_reports_errors_against_the_file(tmp_path: Path) -> None:
    path = tmp_path / "syncd.toml"
    path.write_text("[sync]\njitter = 2\n")
    with pytest.raises(ConfigError, match=re.escape(f"sync.jitter = 2: must be between 0 and 1 "
                                                    f"(from {path})")):
        load_config(path, env=ENV)


def test_load_config_without_path_uses_the_default_file_when_present(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert load_config(None, env=env) == parse_config(b"", env=env)  # no file: defaults
    default = default_config_path(env)
    default.parent.mkdir(parents=True)
    default.write_text('[daemon]\nlisten = "127.0.0.1:0"\n')
    assert load_config(None, env=env).daemon.listen == "127.0.0.1:0"


# --- addresses ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:7777", ("127.0.0.1", 7777)),
    ("localhost:0", ("localhost", 0)),
    ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ("[::1]:7777", ("::1", 7777)),
    ("[::]:80", ("::", 80)),
    ("plane.example.com:443", ("plane.example.com", 443)),
])
def test_parse_listen_accepts(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(("text", "reason"), [
    ("127.0.0.1", "expected host:port, e.g. 127.0.0.1:7777"),
    ("17807", "expected host:port; for this machine only, 127.0.0.1:17807"),
    ("", "expected host:port, e.g. 127.0.0.1:7777"),
    (":7777", "the host is empty"),
    ("127.0.0.1:", "is not a number from 0 to 65535"),
    ("127.0.0.1:65536", "is not a number from 0 to 65535"),
    ("127.0.0.1:-1", "is not a number from 0 to 65535"),
    ("127.0.0.1:http", "is not a number from 0 to 65535"),
    ("127.0.0.1:٣", "is not a number from 0 to 65535"),
    ("::1:7777", "needs brackets"),
    ("[::1]", "expected [ipv6-address]:port"),
    ("[127.0.0.1]:80", "is not an IPv6 address"),
    ("999.1.1.1:80", "is not a valid host name or IP address"),
    ("bad_host:80", "is not a valid host name or IP address"),
    ("http://x:80", "expected host:port, not a URL"),
])
def test_parse_listen_rejects(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_listen(text)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("example.com", False),
])
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_the_allow_non_loopback_flag_covers_a_listen_from_the_file(tmp_path: Path) -> None:
    """``syncd run --allow-non-loopback`` is the setting: a config file's non-loopback
    ``daemon.listen`` is accepted with it (it was refused before the flag was looked at),
    and still refused without it. (No socket is bound here.)"""
    from syncd.commands.settings import command_settings
    path = tmp_path / "syncd.toml"
    path.write_text('[daemon]\nlisten = "0.0.0.0:7777"\n')
    args = argparse.Namespace(config=path, command="run", listen=None, data_dir=tmp_path,
                              allow_non_loopback=True)
    settings = command_settings(args)
    assert (settings["host"], settings["port"]) == ("0.0.0.0", 7777)
    assert settings["config"].daemon.allow_non_loopback is True
    args.allow_non_loopback = False
    with pytest.raises(ValueError, match=r"daemon\.listen .*allow_non_loopback = true"):
        command_settings(args)


def test_the_versions_section_sets_the_history_kept() -> None:
    config = parse_config(b"[versions]\nkeep = 5\nmax_age_days = 30\n", env=ENV)
    assert (config.versions.keep, config.versions.max_age_days) == (5, 30.0)
    env = parse_config(b"", env={**ENV, "SYNCD_VERSIONS_KEEP": "7"})
    assert env.versions.keep == 7


@pytest.mark.parametrize(("data", "field"), [
    ("[versions]\nkeep = -1\n", "versions.keep"),
    ("[versions]\nkeep = 1.5\n", "versions.keep"),
    ("[versions]\nmax_age_days = -2\n", "versions.max_age_days"),
    ("[versions]\nmax_age_days = nan\n", "versions.max_age_days"),
    ("[versions]\nkept = 3\n", "versions.kept"),
])
def test_bad_versions_settings_name_the_field(data: str, field: str) -> None:
    assert field in str(_error(data))
