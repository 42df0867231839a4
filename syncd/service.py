"""``syncd service install|uninstall|status``: run the daemon under systemd (user unit) or
launchd (user agent).

The unit templates are ``deploy/systemd/syncd.service`` and ``deploy/launchd/dev.syncd.agent.plist``,
shipped as package data in ``syncd/deploy_templates/`` (a test keeps the copies identical).
Rendering fills ``{{SYNCD}}`` (this installation's ``syncd`` script by its absolute path, the
one that is running when started as ``syncd``: ``places.syncd_command``, else ``python -m syncd``),
``{{CONFIG}}``, ``{{DATA_DIR}}`` and ``{{LOG_DIR}}`` with absolute paths.

Rules:
  * Each path is escaped for the directive it lands in: ``%`` → ``%%`` everywhere (specifiers),
    ``$`` → ``$$`` in an ``ExecStart=`` argument only (variable expansion; ``ReadWritePaths=``
    takes ``$`` as it is).
  * A path holding a newline or another control character is refused (``ValueError``) before
    anything is rendered or written: a newline would end the directive and start another.
  * ``uninstall`` keeps the unit file when the service manager could not stop the service, and
    says so (exit 75): it may still be running, and uninstalling again retries.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import escape

from syncd.config import has_control_characters
from syncd.exits import EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL
from syncd.places import syncd_command

SYSTEMD_UNIT = "syncd.service"
LAUNCHD_LABEL = "dev.syncd.agent"
LAUNCHD_PLIST = f"{LAUNCHD_LABEL}.plist"


@dataclass(frozen=True)
class Paths:
    config: Path
    data_dir: Path
    log_dir: Path
    # The directory of ``daemon.unix_socket`` when it lies outside the data directory: the
    # daemon creates the socket there, and the unit leaves only the data directory writable.
    socket_dir: Path | None = None
    # ``daemon.shutdown_timeout_secs``: the service manager must wait longer than the drain.
    shutdown_secs: float = 10.0
    # ``syncd.places.default_cache_dir``: where the embedding process keeps the fused MiniLM
    # graph. Read-only under the unit, every load of the model (the first embed after each idle
    # unload) rebuilds it: 1.2 s instead of 0.4, past the prompt hook's 1 s.
    cache_dir: Path | None = None


STOP_MARGIN_SECS = 20  # beyond the drain: closing the store, a last WAL checkpoint
MIN_STOP_SECS = 30


def stop_timeout(paths: Paths) -> int:
    """Seconds the service manager waits for a stop before killing the daemon."""
    return max(MIN_STOP_SECS, math.ceil(paths.shutdown_secs) + STOP_MARGIN_SECS)


def default_platform() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def launcher() -> list[str]:
    """The command that starts this installation's syncd (``places.syncd_command``): the
    running ``syncd`` script, else the one beside the interpreter, else ``python -m syncd``."""
    return syncd_command()


def template(name: str) -> str:
    return (resources.files("syncd") / "deploy_templates" / name).read_bytes().decode()


def _systemd_word(text: str, *, command: bool = False) -> str:
    text = text.replace("%", "%%")  # specifiers
    if command:
        text = text.replace("$", "$$")  # environment variable expansion (not in argv[0])
    if any(c.isspace() or c in "\"'\\;" for c in text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def check_paths(paths: Paths, command: list[str] | None = None) -> None:
    """ValueError naming the first path (or ``command`` word) a unit cannot hold: one with a
    newline or another control character."""
    named = [("the config file", str(paths.config)), ("the data directory", str(paths.data_dir)),
             ("the log directory", str(paths.log_dir))]
    named += [("the cache directory", str(paths.cache_dir))] if paths.cache_dir else []
    named += [("the syncd command", word) for word in command or ()]
    for what, text in named:
        if has_control_characters(text):
            raise ValueError(f"{what} {json.dumps(text, ensure_ascii=False)} contains a newline "
                             "or another control character, which a service unit cannot hold; "
                             "choose another path")


def render_systemd(paths: Paths, command: list[str] | None = None) -> str:
    command = launcher() if command is None else command
    check_paths(paths, command)
    lines = []
    for line in template(SYSTEMD_UNIT).splitlines(keepends=True):
        argument = line.startswith("ExecStart")  # $ expands in a command's arguments only
        lines.append(line
                     .replace("{{SYNCD}}", " ".join(_systemd_word(a, command=i > 0)  # not argv[0]
                                                    for i, a in enumerate(command)))
                     .replace("{{CONFIG}}", _systemd_word(str(paths.config), command=argument))
                     .replace("{{DATA_DIR}}", _systemd_word(str(paths.data_dir),
                                                            command=argument)))
    unit = "".join(lines).replace(f"\nTimeoutStopSec={MIN_STOP_SECS}\n",
                                  f"\nTimeoutStopSec={stop_timeout(paths)}\n")
    for extra in (paths.socket_dir, paths.cache_dir):  # last one first on the line
        if extra is not None and not extra.is_relative_to(paths.data_dir):
            # "-": a directory missing at start is skipped rather than failing the unit
            unit = unit.replace("\nReadWritePaths=", "\nReadWritePaths=" + _systemd_word(
                f"-{extra}") + " ", 1)
    if any(_in_tmp(path) for path in (paths.data_dir, paths.config, paths.socket_dir)
           if path is not None):
        unit = unit.replace("\nPrivateTmp=yes\n", "\n" + PRIVATE_TMP_OFF)
    return unit


PRIVATE_TMP_OFF = ("# Off here: the data directory, the config file or the unix socket is under "
                   "/tmp or /var/tmp,\n# which a private /tmp would hide (an empty store, a "
                   "socket no client can reach).\nPrivateTmp=no\n")


def _in_tmp(path: Path) -> bool:
    return any(candidate.is_relative_to(tmp) for candidate in (path, path.resolve())
               for tmp in (Path("/tmp"), Path("/var/tmp")))


def render_launchd(paths: Paths, command: list[str] | None = None) -> str:
    command = launcher() if command is None else command
    check_paths(paths, command)  # XML 1.0 cannot hold most control characters at all
    text = template(LAUNCHD_PLIST)
    for line in text.splitlines(keepends=True):
        if "<string>{{SYNCD}}</string>" in line:
            indent = line[:len(line) - len(line.lstrip())]
            text = text.replace(line, "".join(f"{indent}<string>{escape(a)}</string>\n"
                                              for a in command))
            break
    text = text.replace("\t<key>ThrottleInterval</key>", "\t<key>ExitTimeOut</key>\n"
                        f"\t<integer>{stop_timeout(paths)}</integer>\n"
                        "\t<key>ThrottleInterval</key>", 1)
    return (text.replace("{{CONFIG}}", escape(str(paths.config)))
            .replace("{{DATA_DIR}}", escape(str(paths.data_dir)))
            .replace("{{LOG_DIR}}", escape(str(paths.log_dir))))


def render(platform: str, paths: Paths) -> str:
    return render_launchd(paths) if platform == "launchd" else render_systemd(paths)


def unit_path(platform: str) -> Path:
    home = Path.home()
    if platform == "launchd":
        return home / "Library" / "LaunchAgents" / LAUNCHD_PLIST
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg.startswith("/") else home / ".config"
    return base / "systemd" / "user" / SYSTEMD_UNIT


def _tool(platform: str) -> str | None:
    name = "launchctl" if platform == "launchd" else "systemctl"
    found = shutil.which(name)
    if found is None:
        print(f"syncd: {name} not found on PATH; cannot manage the {platform} service here. "
              f"`syncd service install --{platform} --print` writes the unit to stdout; install "
              f"it by hand (deploy/{platform}/README.md in syncd's source).", file=sys.stderr)
    return found


def _run(*command: str) -> int:
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    try:
        return subprocess.run(command, check=False).returncode
    except OSError as exc:
        print(f"syncd: {command[0]}: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL


def _quiet(*command: str) -> int:
    """``command``'s exit code, its output discarded."""
    try:
        return subprocess.run(command, check=False, capture_output=True).returncode
    except OSError:
        return EXIT_TEMPFAIL


def _gui_domain() -> str:
    return f"gui/{os.getuid()}"


def install(platform: str, paths: Paths) -> int:
    """Raises ValueError (``check_paths``) before anything is written."""
    check_paths(paths, launcher())
    tool = _tool(platform)
    if tool is None:
        return EXIT_TEMPFAIL
    target = unit_path(platform)
    paths.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # ReadWritePaths needs it
    if paths.cache_dir is not None:  # the unit cannot create it under a read-only ~/.cache
        paths.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not paths.config.exists():  # the unit names the file; an empty one means the defaults
        paths.config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths.config.write_text("# syncd configuration: deploy/syncd.example.toml in syncd's "
                                "source lists every option with its default.\n",
                                encoding="utf-8")
    if platform == "launchd":
        paths.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(platform, paths), encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    if platform == "launchd":
        subprocess.run([tool, "bootout", f"{_gui_domain()}/{LAUNCHD_LABEL}"], check=False,
                       capture_output=True)  # an earlier install; absent is fine
        code = _run(tool, "bootstrap", _gui_domain(), str(target))
    else:
        code = _run(tool, "--user", "daemon-reload") or _run(
            tool, "--user", "enable", "--now", SYSTEMD_UNIT)
    if code:
        hint = (" (its message is above). Without a user session — e.g. over ssh — systemd has "
                "no user manager: `loginctl enable-linger $USER` gives it one; then run "
                "`syncd service install` again" if platform == "systemd" else "")
        print(f"syncd: the service manager refused (exit {code}); the unit is at {target}"
              f"{hint}", file=sys.stderr)
        return EXIT_TEMPFAIL
    print(f"syncd service installed and started ({platform}); `syncd service status` shows it")
    return EXIT_OK


def uninstall(platform: str) -> int:
    tool = _tool(platform)
    if tool is None:
        return EXIT_TEMPFAIL
    target = unit_path(platform)
    installed = target.exists()
    if platform == "launchd":
        service = f"{_gui_domain()}/{LAUNCHD_LABEL}"
        code = _run(tool, "bootout", service)
        if code and _quiet(tool, "print", service) != 0:
            code = 0  # not loaded (booted out already): nothing to stop
    else:
        code = _run(tool, "--user", "disable", "--now", SYSTEMD_UNIT)
    if code and installed:
        print(f"syncd: the service manager could not stop the service (exit {code}); it may "
              f"still be running. {target} is kept: `syncd service uninstall` again retries",
              file=sys.stderr)
        return EXIT_TEMPFAIL
    try:
        target.unlink()
        print(f"removed {target}", file=sys.stderr)
    except FileNotFoundError:
        print(f"syncd: {target} was not installed", file=sys.stderr)
    if platform == "systemd":
        _run(tool, "--user", "daemon-reload")
    return EXIT_OK


def status(platform: str) -> int:
    tool = _tool(platform)
    if tool is None:
        return EXIT_TEMPFAIL
    if platform == "launchd":
        code = _run(tool, "print", f"{_gui_domain()}/{LAUNCHD_LABEL}")
    else:
        code = _run(tool, "--user", "status", SYSTEMD_UNIT)
    return EXIT_OK if code == 0 else EXIT_FAILED
