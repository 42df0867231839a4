"""Starting the daemon for ``syncd mcp`` when none answers (``[mcp] autostart``).

How: through the service manager when ``syncd service install`` set up a unit whose
``--data-dir`` is this data directory (``systemctl --user start syncd.service``, ``launchctl
kickstart``); otherwise — or when the service manager refuses — a detached ``syncd run`` with the
same ``--config`` and ``--data-dir``: a new session (no terminal, not in the MCP server's process
group, so neither the agent's exit nor its signals reach it), stdin from /dev/null, stdout and
stderr appended to ``<data-dir>/daemon.log``, cwd the data directory.

Rules:
  * "Answers" means ``GET /healthz`` is 200 at the daemon's URL, read again from its state file
    on every poll (the configured address until the daemon writes one: ``listen`` port 0).
  * One start at a time per data directory, across processes: the one that holds the flock on
    ``<data-dir>/autostart.lock`` starts a daemon and keeps the lock until it answers or the
    wait is over; the others wait for the lock, find the daemon answering and start nothing.
    (Were two daemons started anyway, the store's own lock lets one open the store; the other
    exits 75, touching nothing.) The lock file is never inherited by the daemon.
  * A wait polls with back-off and ends after ``start_timeout_secs``, or at once when the
    started ``syncd run`` exits with anything but 75. 75 (the data directory or the port is
    taken) waits on while another process holds the store — a daemon starting, or one still
    stopping — and starts ``syncd run`` again once none does, ``MAX_RESPAWNS`` times at most.
    Its failure is a message naming the fix and where the daemon's log is, with the log's
    last line.
  * The attempt belongs to the MCP server (a kept task, cancelled when it stops); the daemon
    it started does not, and outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import itertools
import logging
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp

from syncd.exits import EXIT_TEMPFAIL
from syncd.service import LAUNCHD_LABEL, SYSTEMD_UNIT, unit_path
from syncd.state import read_state
from syncd.storelock import store_in_use

log = logging.getLogger("syncd.autostart")

LOG_FILENAME: Final = "daemon.log"
LOCK_FILENAME: Final = "autostart.lock"
LOG_KEEP_BYTES: Final = 1024 * 1024  # past this the log moves to daemon.log.1 before a start
HEALTH_TIMEOUT: Final = 2.0
FIRST_POLL: Final = 0.05
LAST_POLL: Final = 1.0
MAX_RESPAWNS: Final = 2  # after a start that exited 75 while nothing held the store


def daemon_url(data_dir: Path, listen_url: str) -> str:
    """Where the daemon of ``data_dir`` answers: its state file's URL, else the configured one."""
    return str((read_state(data_dir) or {}).get("url") or listen_url)


def unit_data_dir(text: str, platform: str) -> Path | None:
    """The ``--data-dir`` of the ``syncd run`` an installed unit (a systemd unit, a launchd
    plist: what ``syncd service install`` wrote) starts; None when it names none."""
    if platform == "launchd":
        try:
            words = plistlib.loads(text.encode("utf-8")).get("ProgramArguments") or []
        except (plistlib.InvalidFileException, ValueError, AttributeError):
            return None
    else:
        line = next((ln for ln in text.splitlines() if ln.startswith("ExecStart=")), "")
        try:  # systemd quotes as a shell does; %% and $$ are its escapes
            words = [w.replace("$$", "$") for w in shlex.split(
                line.removeprefix("ExecStart=").replace("%%", "%"))]
        except ValueError:
            return None
    for flag, value in itertools.pairwise(words):
        if flag == "--data-dir" and isinstance(value, str):
            return Path(value)
    return None


def installed_service(data_dir: Path, platform: str) -> list[str] | None:
    """The command that starts the installed service of ``data_dir``, or None when no unit is
    installed, it serves another data directory, or its service manager is not on PATH."""
    try:
        text = unit_path(platform).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    served = unit_data_dir(text, platform)
    if served is None or not _same_dir(served, data_dir):
        return None
    if platform == "launchd":
        tool = shutil.which("launchctl")
        return None if tool is None else [tool, "kickstart", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"]
    tool = shutil.which("systemctl")
    return None if tool is None else [tool, "--user", "start", SYSTEMD_UNIT]


def _same_dir(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def run_command(config: Path | None, data_dir: Path) -> list[str]:
    """The detached daemon's command line: this interpreter's syncd, the same files."""
    chosen = [] if config is None else ["--config", str(config)]
    return [sys.executable, "-m", "syncd", *chosen, "--data-dir", str(data_dir), "run"]


@dataclass(frozen=True)
class _Launch:
    """A start under way: ``pid`` of the detached ``syncd run`` (None: the service manager's),
    and where to look when it fails."""

    pid: int | None
    see: str


class DaemonStarter:
    """``syncd.mcp_stdio.Starter`` for one data directory."""

    def __init__(self, *, config: Path | None, data_dir: Path, listen_url: str,
                 timeout: float, platform: str) -> None:
        self.config = None if config is None else config.expanduser().absolute()
        self.data_dir = data_dir.expanduser().absolute()
        self.listen_url, self.timeout, self.platform = listen_url, timeout, platform
        self.log_path = self.data_dir / LOG_FILENAME
        self._attempt: asyncio.Task[str | None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._children: set[int] = set()  # detached daemons started here, reaped once exited

    def begin(self) -> None:
        if self._attempt is None:
            self._attempt = asyncio.create_task(self._start(), name="syncd-autostart")

    async def ensure(self) -> str | None:
        if self._attempt is None or self._attempt.done():
            self._attempt = asyncio.create_task(self._start(), name="syncd-autostart")
        return await asyncio.shield(self._attempt)

    async def close(self) -> None:
        self._reap()
        if self._attempt is not None:
            self._attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._attempt
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ one attempt

    async def _start(self) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        self._reap()
        if await self.answers():
            return None
        lock = await self._lock(deadline)
        try:
            if await self.answers():
                return None  # another MCP server started it while this one waited
            if lock is None:
                return self._late(None)
            launch = await self._launch()
            return await self._wait_up(launch, deadline)
        finally:
            if lock is not None:
                os.close(lock)

    async def answers(self) -> bool:
        """Whether the daemon answers ``/healthz`` now."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                trust_env=False, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT))
        url = await asyncio.to_thread(daemon_url, self.data_dir, self.listen_url)
        try:
            async with self._session.get(url.rstrip("/") + "/healthz") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return False

    async def _lock(self, deadline: float) -> int | None:
        """The start lock's fd; None when the wait ended first or the daemon came up."""
        loop = asyncio.get_running_loop()
        fd = await asyncio.to_thread(self._open_lock)
        delay = FIRST_POLL
        while not await asyncio.to_thread(_try_flock, fd):
            if loop.time() + delay > deadline or await self.answers():
                os.close(fd)
                return None
            await asyncio.sleep(delay)
            delay = min(2 * delay, LAST_POLL)
        return fd

    def _open_lock(self) -> int:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(self.data_dir / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o600)

    async def _launch(self) -> _Launch:
        service = await asyncio.to_thread(installed_service, self.data_dir, self.platform)
        if service is not None:
            log.warning("no syncd daemon answers; starting the %s service: %s", self.platform,
                        shlex.join(service))
            refusal = await asyncio.to_thread(_run_quietly, service, self.timeout)
            if refusal is None:
                return _Launch(None, self._service_log())
            log.warning("the service manager did not start it (%s); starting `syncd run` "
                        "detached instead", refusal)
        return await self._detached()

    async def _detached(self) -> _Launch:
        command = run_command(self.config, self.data_dir)
        url = await asyncio.to_thread(daemon_url, self.data_dir, self.listen_url)
        log.warning("no syncd daemon answers at %s; starting one: %s (its log: %s)", url,
                    shlex.join(command), self.log_path)
        pid = await asyncio.to_thread(self._spawn, command, url)
        self._children.add(pid)
        return _Launch(pid, str(self.log_path))

    def _spawn(self, command: list[str], url: str) -> int:
        """``command`` detached (see the module docstring); its pid."""
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > LOG_KEEP_BYTES:
                os.replace(self.log_path, self.log_path.with_name(LOG_FILENAME + ".1"))
        out = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            os.write(out, f"{when} syncd mcp (pid {os.getpid()}): no daemon answered at {url}; "
                          f"starting: {shlex.join(command)}\n".encode())
            # sh only to enter the data directory: it execs syncd, which keeps the pid
            argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(self.data_dir), *command]
            return os.posix_spawn("/bin/sh", argv, dict(os.environ), setsid=True, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)])
        finally:
            os.close(out)

    async def _wait_up(self, launch: _Launch, deadline: float) -> str | None:
        loop = asyncio.get_running_loop()
        exited: int | None = None
        delay, respawns = FIRST_POLL, MAX_RESPAWNS
        while not await self.answers():
            if launch.pid is not None and exited is None:
                exited = self._exited(launch.pid)
            if exited is not None and exited != EXIT_TEMPFAIL:
                return await self._failed(launch, exited)
            if exited is not None and not await asyncio.to_thread(store_in_use, self.data_dir):
                # 75, and nothing holds the store now (a daemon that was stopping, say)
                if respawns == 0:
                    return await self._failed(launch, exited)
                respawns, exited = respawns - 1, None
                launch = await self._detached()
            if loop.time() + delay > deadline:
                return self._late(launch) if exited is None else await self._failed(launch,
                                                                                    exited)
            await asyncio.sleep(delay)
            delay = min(2 * delay, LAST_POLL)
        return None

    def _exited(self, pid: int) -> int | None:
        code = _exit_code(pid)
        if code is not None:
            self._children.discard(pid)
        return code

    def _reap(self) -> None:
        """Collect the exit of daemons started here that have stopped since (no zombies)."""
        self._children = {pid for pid in self._children if _exit_code(pid) is None}

    async def _failed(self, launch: _Launch, code: int) -> str:
        last = await asyncio.to_thread(_last_line, self.log_path)
        said = f": {last}" if last else ""
        return (f"syncd daemon exited as it started (exit {code}){said} — see {launch.see}; "
                f"`syncd run` in a terminal shows the whole error")

    def _late(self, launch: _Launch | None) -> str:
        see = self.log_path if launch is None else launch.see
        return (f"syncd daemon did not start within {self.timeout:g} s: run `syncd run` to see "
                f"why, or see {see}")

    def _service_log(self) -> str:
        if self.platform == "launchd":
            return "~/Library/Logs/syncd/syncd.err.log"
        return f"`journalctl --user -u {SYSTEMD_UNIT}`"


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _exit_code(pid: int) -> int | None:
    """The exit code of our child ``pid`` once it has exited (reaping it), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already: gone, its code unknown
        return 0
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def _run_quietly(command: list[str], timeout: float) -> str | None:
    """None when ``command`` succeeded, else what went wrong."""
    try:
        done = subprocess.run(command, check=False, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    return f"exit {done.returncode}" + (f": {said[-1][:300]}" if said else "")


def _last_line(path: Path) -> str:
    """The last non-empty line of the log (its end only), shortened."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
