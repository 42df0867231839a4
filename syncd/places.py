"""Where syncd lives on this machine: the platform's config and data paths, stdlib only.

Rules:
  * No imports beyond the standard library's cheapest (``os``, ``sys``, ``pathlib``): the prompt
    hook (``syncd.hook``) resolves the daemon's data directory with these on every prompt, and
    ``syncd.config`` re-exports them, so the two can never disagree.
  * ``env`` and ``platform`` are parameters (defaulting to this process's), keeping them pure
    for table-driven tests.
  * What other programs are told to run (a service unit, an agent's hook and MCP server) is
    this install's own ``syncd`` (``syncd_command``), named by an absolute path that stays put
    across upgrades: the console script that is running, else the one beside this interpreter
    (a venv's, pipx's or uv's ``bin/``), else this interpreter with ``-m syncd``. Never a
    ``syncd`` looked up on ``PATH``: that may be another install's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

APP_NAME = "syncd"
CONFIG_FILE_NAME = "config.toml"
ENV_PREFIX = "SYNCD_"  # SYNCD_<SECTION>_<FIELD> overrides an option (syncd.config)


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME", "")
    return Path(home) if os.path.isabs(home) else Path.home()


def _base_dir(env: Mapping[str, str], platform: str, xdg_var: str, xdg_default: str) -> Path:
    if platform == "darwin":
        return _home(env) / "Library" / "Application Support"
    xdg = env.get(xdg_var, "")
    # The XDG spec: a relative value is invalid and must be ignored.
    return Path(xdg) if os.path.isabs(xdg) else _home(env) / xdg_default


def default_data_dir(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """``$XDG_DATA_HOME/syncd`` or ``~/.local/share/syncd``; on macOS
    ``~/Library/Application Support/syncd``. ``env``/``platform`` default to this process's."""
    env = os.environ if env is None else env
    return _base_dir(env, platform or sys.platform, "XDG_DATA_HOME", ".local/share") / APP_NAME


def default_cache_dir(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """``$XDG_CACHE_HOME/syncd`` or ``~/.cache/syncd``; on macOS ``~/Library/Caches/syncd``:
    what syncd keeps only to be faster and can rebuild (the fused MiniLM graph,
    ``local_store.minilm_cache``; the prompt hook's resolved address), safe to delete."""
    env = os.environ if env is None else env
    platform = platform or sys.platform
    if platform == "darwin":
        return _home(env) / "Library" / "Caches" / APP_NAME
    return _base_dir(env, platform, "XDG_CACHE_HOME", ".cache") / APP_NAME


def default_hub_data_dir(env: Mapping[str, str] | None = None,
                         platform: str | None = None) -> Path:
    """``syncd-hub`` beside the daemon's default data directory."""
    return default_data_dir(env, platform).with_name(APP_NAME + "-hub")


def default_config_path(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """``$XDG_CONFIG_HOME/syncd/config.toml`` or ``~/.config/syncd/config.toml``; on macOS
    ``~/Library/Application Support/syncd/config.toml``."""
    env = os.environ if env is None else env
    base = _base_dir(env, platform or sys.platform, "XDG_CONFIG_HOME", ".config")
    return base / APP_NAME / CONFIG_FILE_NAME


def expand_path(text: str, env: Mapping[str, str] | None = None) -> Path:
    """Expand a leading ``~`` (from ``env``'s HOME when set); does not make the path absolute."""
    env = os.environ if env is None else env
    if text == "~" or text.startswith("~/"):
        return _home(env) / text[2:]
    return Path(os.path.expanduser(text))


def running_script(argv0: str | None = None) -> Path | None:
    """The ``syncd`` console script this process was started as (``argv0``, default
    ``sys.argv[0]``), as an absolute path, not resolved: a pipx or uv link in ``~/.local/bin``
    stays the link. None when started otherwise (``python -m syncd``, a test)."""
    script = Path(sys.argv[0] if argv0 is None else argv0)
    if script.name != APP_NAME or not script.is_file() or not os.access(script, os.X_OK):
        return None
    return script.absolute()


def syncd_command(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """How another program runs this install's syncd (the module docstring's rule)."""
    script = running_script(argv0)
    if script is not None:
        return [str(script)]
    interpreter = sys.executable if executable is None else executable
    beside = Path(interpreter).parent / APP_NAME
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [interpreter, "-m", APP_NAME]


def has_control_characters(text: str) -> bool:
    """NUL, newline, tab, DEL or another ASCII control character: no path needs one."""
    return any(ord(c) < 0x20 or c == "\x7f" for c in text)
