"""``syncd.hook_config`` (the prompt hook's tomllib reading of the config) against
``syncd.config.load_config`` read as ``syncd.commands.settings.command_settings`` reads it: on
a matrix of configs and on edge values of every option it vouches for, it resolves the same data directory and URL or
gives way (None), and it never accepts a config that ``load_config`` refuses."""

from __future__ import annotations

import argparse
import os
import typing
from pathlib import Path

import pytest

from syncd import config as full
from syncd.commands.settings import command_settings
from syncd.hook import daemon_address
from syncd.hook_config import MAX_PERIOD_SECS, OPTIONS, fast_address

ROOT = Path(__file__).resolve().parents[2]


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
    """Asserts the fast reading is the full one's (or None); True when it was taken."""
    fast = fast_address(config, env)
    expected = settings(config, None, env)
    if fast is not None:
        assert fast == expected, (config, env)
    assert (daemon_address(config, None, env) if expected else None) == expected
    return fast is not None


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
