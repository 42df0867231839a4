"""``syncd.hook_config`` (the prompt hook's tomllib reading of the config) against
``syncd.config.load_config`` read as ``syncd.commands.settings.command_settings`` reads it: on
a matrix of configs and on edge values of every option it vouches for, it resolves the same data directory and URL or
gives way (None), and it never accepts a config that ``load_config`` refuses — read, and
from its cache: kept, then after the file is edited, replaced, deleted or the environment
changes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
import typing
from pathlib import Path

import pytest

from syncd import config as full
from syncd.commands.settings import command_settings
from syncd.hook import daemon_address
from syncd.hook_config import (
    CACHE_FILE_NAME,
    MAX_PERIOD_SECS,
    OPTIONS,
    RACY_NS,
    cache_key,
    fast_address,
    read_cache,
)
from syncd.places import default_cache_dir

ROOT = Path(__file__).resolve().parents[2]


def later() -> int:
    """The tests' clock for caching: every config is older than the racy-file window."""
    return time.time_ns() + 10 * RACY_NS


def cache_of(env: dict[str, str]) -> Path:
    return default_cache_dir(env) / CACHE_FILE_NAME


def names_a_user(config: Path | None, env: dict[str, str]) -> bool:
    """A ``~user`` value in the file or ``SYNCD_*``: resolved, never cached."""
    values = [v for k, v in env.items() if k.startswith("SYNCD_")]
    path = full.default_config_path(env) if config is None else config
    try:
        values += [v for table in tomllib.loads(path.read_text()).values()
                   if isinstance(table, dict) for v in table.values()]
    except (OSError, tomllib.TOMLDecodeError):
        pass
    return any(isinstance(v, str) and v.startswith("~") and v != "~" and not v.startswith("~/")
               for v in values)


def settings(config: Path | None, data_dir: Path | None,
             env: dict[str, str]) -> tuple[Path, str] | None:
    """What every command resolves (None: it refuses the config)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        found = command_settings(argparse.Namespace(command="recall", config=config,
                                                    data_dir=data_dir))
    except ValueError:
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return found["data_dir"], found["url"]


def agrees(config: Path | None, env: dict[str, str]) -> bool:
    """Asserts the fast reading is the full one's (or None), resolved and then from the cache
    it keeps; True when it was taken. Leaves no cache behind."""
    cache = cache_of(env)
    cache.unlink(missing_ok=True)
    fast = fast_address(config, env)
    expected = settings(config, None, env)
    if fast is not None:
        assert fast == expected, (config, env)
    assert (daemon_address(config, None, env) if expected else None) == expected
    cache.unlink(missing_ok=True)
    assert fast_address(config, env, clock=later) == fast  # resolved, then kept
    key = cache_key(config, env)
    kept = fast is not None and key is not None and not names_a_user(config, env)
    assert cache.exists() == kept, (config, env)
    if key is not None:
        assert read_cache(cache, key) == (fast if kept else None)
    assert fast_address(config, env, clock=later) == fast  # from the cache when kept
    assert (daemon_address(config, None, env) if expected else None) == expected
    cache.unlink(missing_ok=True)
    return fast is not None


def assert_same(config: Path | None, env: dict[str, str]) -> None:
    """The fast reading (with whatever cache is there) is the full one's, or None."""
    expected = settings(config, None, env)
    for clock in (time.time_ns, later):
        fast = fast_address(config, env, clock=clock)
        assert fast is None or fast == expected, (config, env, fast, expected)
    assert (daemon_address(config, None, env) if expected else None) == expected


def test_the_shared_constants_are_the_configs() -> None:
    assert MAX_PERIOD_SECS == full.MAX_PERIOD_SECS
    assert set(OPTIONS) <= {(s, n) for s, fields in full._TYPES.items() for n in fields}


MATRIX: dict[str, tuple[str, dict[str, str], bool]] = {
    # name: (file text, SYNCD_* variables, taken fast)
    "default": ("", {}, True),
    "listen": ('[daemon]\nlisten = "127.0.0.1:7001"\n', {}, True),
    "listen localhost": ('[daemon]\nlisten = "localhost:0"\n', {}, True),
    "listen ipv6": ('[daemon]\nlisten = "[::1]:07002"\n', {}, True),
    "listen elsewhere": ('[daemon]\nlisten = "0.0.0.0:7001"\nallow_non_loopback = true\n', {},
                         False),
    "listen refused": ('[daemon]\nlisten = "0.0.0.0:7001"\n', {}, False),
    "data dir": ('[daemon]\ndata_dir = "~/d"\n', {}, True),
    "data dir absolute": ('[daemon]\ndata_dir = "/srv/syncd"\n', {}, True),
    "data dir relative": ('[daemon]\ndata_dir = "rel/d"\n', {}, False),
    "env listen": ("", {"SYNCD_DAEMON_LISTEN": "127.0.0.1:7003"}, True),
    "env over file": ('[daemon]\nlisten = "127.0.0.1:7001"\ndata_dir = "/a"\n',
                      {"SYNCD_DAEMON_LISTEN": "localhost:7004", "SYNCD_DAEMON_DATA_DIR": "~/e"},
                      True),
    "env relative data dir": ("", {"SYNCD_DAEMON_DATA_DIR": "rel"}, False),
    "env bad listen": ("", {"SYNCD_DAEMON_LISTEN": "127.0.0.1:99999"}, False),
    "env number": ("", {"SYNCD_SYNC_INTERVAL_SECS": "5"}, False),
    "env unknown": ("", {"SYNCD_DAEMON_NOPE": "1"}, False),
    "joined": ('[control_plane]\nurl = "https://hub.example.com:8787/"\n'
               'token_file = "~/.config/syncd/control-plane-token"\n'
               '[entitlement]\npublic_keys = ["AbC-12_x"]\n', {}, True),
    "url with an IP": ('[control_plane]\nurl = "http://10.0.0.5:8787"\n', {}, False),
    "bad option elsewhere": ('[daemon]\nlisten = "127.0.0.1:7001"\n[sync]\ninterval_secs = -5\n',
                             {}, False),
    "unknown option": ('[daemon]\nlisten = "127.0.0.1:7001"\nlisten_port = 1\n', {}, False),
    "section not a table": ("daemon = 1\n", {}, False),
    "bge without cache": ('[embedding]\nmodel = "bge-small-en-v1.5"\n', {}, False),
    "data dir of a user": ('[daemon]\ndata_dir = "~root/d"\n', {}, True),
    "same size as listen": ('[daemon]\nlisten = "127.0.0.1:7009"\n', {}, True),
}


@pytest.mark.parametrize("name", list(MATRIX))
@pytest.mark.parametrize("where", ["--config", "--config relative", "default path"])
def test_a_matrix_of_configs_resolves_as_the_full_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, where: str) -> None:
    text, variables, fast = MATRIX[name]
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "XDG_DATA_HOME": str(tmp_path / "share"), **variables}
    default = tmp_path / "cfg" / "syncd" / "config.toml"
    path = default if where == "default path" else tmp_path / "c.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    config = {"--config": path, "--config relative": Path("c.toml"), "default path": None}[where]
    assert agrees(config, env) == fast


def test_the_example_config_is_read_fast(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert agrees(ROOT / "deploy" / "syncd.example.toml", env)


NUMBERS = ["-1", "0", "1", "7", "1.0", "0.5", "-0.0", "1e-9", "10000", "10001", "36500",
           "36500.5", "31536000", "31536000.5", "3650", "9007199254740993", "inf", "-inf", "nan"]
STRINGS = ['""', '" "', '"x"', '"~/a"', '"/abs"', '"rel"', '"/a\\tb"', '"/a\\u0000b"',
           '"127.0.0.1:7777"', '"localhost:0"', '"[::1]:65535"', '"127.0.0.1:65536"',
           '"0.0.0.0:7777"', '"127.0.0.2:7777"', '"http://hub.example.com:8787"',
           '"https://hub.example.com/x/"', '"http://h"', '"http://1.2.3.4"', '"http://u:p@h.io"',
           '"http://h.io?q"', '"http://h.io#"', '"http://h.io:99999"', '"http://-bad.io"',
           '"ftp://h.io"', '"http://h.io:"', '"http://h_o.io"', '"key1"', '"a b"', '"sqlite"']
OTHERS = ["true", "false", "[]", '["a"]', '["a b"]', '[""]', "[1]", "{a = 1}", "1979-05-27"]


def choices(section: str, name: str) -> list[str]:
    kind = typing.get_type_hints(full.SECTIONS[section])[name]
    return [f'"{value}"' for value in typing.get_args(kind)
            if isinstance(value, str)] if typing.get_origin(kind) is typing.Literal else []


@pytest.mark.parametrize("option", list(OPTIONS), ids=".".join)
def test_every_value_taken_fast_is_one_the_full_config_takes(tmp_path: Path,
                                                             option: tuple[str, str]) -> None:
    section, name = option
    env = {"HOME": str(tmp_path)}
    path = tmp_path / "c.toml"
    taken = 0
    for value in [*NUMBERS, *STRINGS, *OTHERS, *choices(section, name)]:
        path.write_text(f"[{section}]\n{name} = {value}\n")
        taken += agrees(path, env)
        if value.startswith('"') and "\\" not in value:  # the same text as SYNCD_*
            taken += agrees(None, {**env, f"SYNCD_{section.upper()}_{name.upper()}": value[1:-1]})
    assert taken, f"no value of {section}.{name} is read fast"


def hook_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
            "XDG_DATA_HOME": str(tmp_path / "share"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            **variables}


LISTEN = '[daemon]\nlisten = "127.0.0.1:7001"\n'


@pytest.mark.parametrize("name", list(MATRIX))
@pytest.mark.parametrize("change", ["edited", "replaced by rename", "deleted"])
@pytest.mark.parametrize("where", ["--config", "default path"])
def test_a_kept_answer_follows_the_file(tmp_path: Path, name: str, change: str,
                                        where: str) -> None:
    """A usual config's answer is kept; the file then becomes each of the matrix's configs,
    edited in place (its times moved on by the racy window, as a later edit's would be),
    replaced by a rename keeping its size and mtime, or deleted."""
    text, variables, _ = MATRIX[name]
    env = hook_env(tmp_path, **variables)
    path = tmp_path / "cfg" / "syncd" / "config.toml" if where == "default path" else tmp_path / "c.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LISTEN)
    config = None if where == "default path" else path
    kept = fast_address(config, env, clock=later)
    before = path.stat()
    if kept is not None:
        assert read_cache(cache_of(env), cache_key(config, env) or {}) == kept
    if change == "edited":
        path.write_text(text)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + RACY_NS))
    elif change == "replaced by rename":
        new = path.with_name("new.toml")
        new.write_text(text)
        os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(new, path)
    else:
        path.unlink()
    assert_same(config, env)
    assert_same(config, env)  # and again, with what the first one kept


def test_a_config_changed_within_the_racy_window_is_not_kept(tmp_path: Path) -> None:
    """Edited twice in the same timestamp tick with the same size, the stat would not change:
    an answer is kept only when the file is older than ``RACY_NS``."""
    env = hook_env(tmp_path)
    path = tmp_path / "c.toml"
    path.write_text(LISTEN)
    changed = max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
    assert fast_address(path, env, clock=lambda: changed + RACY_NS - 1) is not None
    assert not cache_of(env).exists()
    times = path.stat()
    path.write_text(LISTEN.replace("7001", "7002"))  # the same size
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))  # and the same mtime
    assert fast_address(path, env) == settings(path, None, env)
    changed = max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
    assert fast_address(path, env, clock=lambda: changed + RACY_NS - 1) is not None
    assert not cache_of(env).exists()
    assert fast_address(path, env, clock=lambda: changed + RACY_NS) is not None
    assert cache_of(env).exists()


@pytest.mark.parametrize("text", [LISTEN, '[daemon]\ndata_dir = "~/d"\n', '[sync]\njitter = 0.5\n'])
@pytest.mark.parametrize("variables", [
    {"HOME": "/elsewhere"}, {"XDG_DATA_HOME": "/other/share"}, {"XDG_CONFIG_HOME": "/nowhere"},
    {"SYNCD_DAEMON_LISTEN": "localhost:7005"}, {"SYNCD_DAEMON_DATA_DIR": "/srv/d"},
    {"SYNCD_SYNC_INTERVAL_SECS": "5"}, {"SYNCD_DAEMON_NOPE": "1"}])
def test_a_kept_answer_follows_the_environment(tmp_path: Path, text: str,
                                               variables: dict[str, str]) -> None:
    env = hook_env(tmp_path)
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert fast_address(path, env, clock=later) is not None
    assert cache_of(env).exists()
    changed = {**env, **variables}
    assert cache_of(changed) == cache_of(env)  # the same cache is read, with another key
    assert_same(path, changed)


def test_no_answer_is_kept_without_an_absolute_home(tmp_path: Path) -> None:
    """``~`` would then come from the passwd database, which no key covers."""
    path = tmp_path / "c.toml"
    path.write_text(LISTEN)
    for home in ("", "relative"):
        assert cache_key(path, {**hook_env(tmp_path), "HOME": home}) is None
    assert cache_key(path, hook_env(tmp_path)) is not None


def test_a_cache_that_cannot_be_written_or_read_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the cache's directory would be")
    env = hook_env(tmp_path)
    path = tmp_path / "c.toml"
    path.write_text(LISTEN)
    expected = settings(path, None, env)
    assert expected is not None
    assert fast_address(path, env, clock=later) == expected
    assert fast_address(path, env, clock=later) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "cache"]
    env = hook_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "readable"))
    cache, key = cache_of(env), cache_key(path, env)
    assert fast_address(path, env, clock=later) == expected
    assert (cache.stat().st_mode & 0o777, cache.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    for broken in (b"", b"not json", b"[]", json.dumps({"key": key}).encode(),
                   json.dumps({"key": key, "answer": ["/d", "http://10.0.0.1:80"]}).encode(),
                   json.dumps({"key": key, "answer": ["rel", "http://127.0.0.1:1"]}).encode(),
                   json.dumps({"key": {**(key or {}), "size": 1},
                               "answer": ["/d", "http://127.0.0.1:1"]}).encode()):
        cache.write_bytes(broken)
        assert fast_address(path, env) == expected
        assert fast_address(path, env, clock=later) == expected
        assert read_cache(cache, key or {}) == expected  # kept again, over the broken one
    assert cache.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in cache.parent.iterdir()] == [CACHE_FILE_NAME]  # no .tmp left


PROBE = ("import json, sys\n"
         "sys.argv = ['syncd', *sys.argv[1:], 'recall', '--hook']\n"
         "from syncd.entry import main\n"
         "main()\n"
         "print(json.dumps('tomllib' in sys.modules))\n")


@pytest.mark.parametrize("event", ["UserPromptSubmit", "SessionStart"])
def test_the_hook_imports_no_tomllib_once_the_answer_is_kept(tmp_path: Path, event: str) -> None:
    """The prompt and the session hooks read a kept answer, not the file; the first run, which
    finds no cache, reads it with tomllib."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")},
           **hook_env(tmp_path)}
    path = tmp_path / "c.toml"
    path.write_text('[daemon]\nlog_level = "info"\n')
    stdin = json.dumps({"session_id": "s", "cwd": str(tmp_path), "hook_event_name": event,
                        "prompt": "how do I ship billing?", "source": "startup"}).encode()

    def imports_tomllib() -> bool:
        out = subprocess.run([sys.executable, "-c", PROBE, "--config", str(path), "--data-dir",
                              str(tmp_path / "never-ran")], input=stdin, capture_output=True,
                             timeout=60, check=True, env=env)
        return bool(json.loads(out.stdout.decode().splitlines()[-1]))

    assert imports_tomllib()
    cache_of(env).unlink(missing_ok=True)
    assert fast_address(path, env, clock=later) is not None  # kept, as a later prompt would
    assert not imports_tomllib()


@pytest.mark.parametrize(("env", "platform", "expected"), [
    ({"HOME": "/home/ada"}, "linux", "/home/ada/.cache/syncd"),
    ({"HOME": "/home/ada", "XDG_CACHE_HOME": "/xc"}, "linux", "/xc/syncd"),
    ({"HOME": "/home/ada", "XDG_CACHE_HOME": "rel"}, "linux", "/home/ada/.cache/syncd"),
    ({"HOME": "/home/ada", "XDG_CACHE_HOME": "/xc"}, "darwin", "/home/ada/Library/Caches/syncd"),
])
def test_the_cache_is_the_users(env: dict[str, str], platform: str, expected: str) -> None:
    assert default_cache_dir(env, platform) == Path(expected)
