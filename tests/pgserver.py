"""A throwaway PostgreSQL server for tests: initdb into a temp dir, start `postgres` on a free
127.0.0.1 port with trust auth, stop it and delete everything afterwards.

    with PgServer.start() as pg:
        dsn = pg.create_database("t1")   # postgresql://syncd@127.0.0.1:<port>/t1

PostgreSQL refuses to run as root, so when we are root initdb and the server run as the
`postgres` system user and the temp dir is chowned to it. The dir comes from tempfile.mkdtemp
(not pytest's tmp_path, which is 0700 root and unreachable by `postgres`).

The postmaster never outlives the process that started it: `stop()` is registered with atexit,
the postmaster runs in its own session so `stop()` can kill whatever is left, and (when started
from the main thread) it gets SIGQUIT, PostgreSQL's immediate shutdown, if its parent dies.

Databases are created and dropped with `psql` as a client over TCP, not with asyncpg, so
`create_database` works the same from sync code and from inside a running event loop.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["SUPERUSER", "PgServer", "PgServerError", "find_bindir"]

SUPERUSER = "syncd"
"""The superuser initdb creates; every DSN connects as it (trust auth, no password)."""

_SYSTEM_USER = "postgres"  # who runs initdb and the server when we are root
_HOST = "127.0.0.1"
_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 30.0
_PORT_ATTEMPTS = 5
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PREFIX = "syncd-pg-"  # temp dirs: <tmp>/syncd-pg-XXXXXXXX
_OWNER = "owner.pid"  # in each temp dir: the pid of the process that made it


class PgServerError(RuntimeError):
    """initdb, the server or a client command failed; the message carries their output."""


def find_bindir() -> Path | None:
    """The PostgreSQL server binaries: $SYNCD_PG_BINDIR, else the highest-versioned
    /usr/lib/postgresql/*/bin (Debian/Ubuntu), else `pg_config --bindir`. None if absent."""
    env = os.environ.get("SYNCD_PG_BINDIR")
    if env:
        return Path(env)
    candidates = [
        d
        for d in Path("/usr/lib/postgresql").glob("*/bin")
        if _has_server(d) and d.parent.name.replace(".", "").isdigit()
    ]
    if candidates:
        return max(candidates, key=lambda d: tuple(int(p) for p in d.parent.name.split(".")))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        if out and _has_server(Path(out)):
            return Path(out)
    return None


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / exe, os.X_OK) for exe in ("postgres", "initdb"))


def _sweep_stale() -> None:
    """Delete temp dirs left by test processes that died without stopping their server (the
    postmaster itself died with them; see `_die_with_parent`)."""
    for d in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((d / _OWNER).read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):
            continue  # no owner file yet, or not ours to judge


def _free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (it may be taken before we use it;
    `PgServer.start` retries on a failed bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _client_env() -> dict[str, str]:
    """Our environment without PG* variables (PGHOST, PGSERVICE, PGOPTIONS...), which would
    otherwise redirect or alter the client commands and the server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no server log: {e})"
    return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"


class PgServer:
    """One running postmaster in its own temp dir. Build it with `PgServer.start()`."""

    def __init__(self, *, bindir: Path, root: Path, durable: bool) -> None:
        self.bindir = bindir
        self.root = root
        self.durable = durable
        self.superuser = SUPERUSER
        self.data_dir = root / "data"
        self.socket_dir = root / "sock"
        self.log_path = root / "server.log"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._run_as: pwd.struct_passwd | None = None  # None: run as ourselves
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam(_SYSTEM_USER)
            except KeyError:
                raise PgServerError(
                    f"running as root, but there is no {_SYSTEM_USER!r} user to run PostgreSQL as "
                    "(PostgreSQL refuses to run as root)"
                ) from None
        self._uid = self._run_as.pw_uid if self._run_as else None
        self._gid = self._run_as.pw_gid if self._run_as else None
        self._groups: list[int] | None = [] if self._run_as else None  # drop root's groups

    # -- lifecycle ------------------------------------------------------------------------

    @classmethod
    def start(cls, *, durable: bool = False, bindir: Path | None = None) -> PgServer:
        """initdb and start a server; return once it accepts connections.

        durable=False (the default) trades crash safety for speed: initdb --no-sync and the
        server with fsync, synchronous_commit and full_page_writes off."""
        bindir = bindir or find_bindir()
        if bindir is None:
            raise PgServerError(
                "PostgreSQL binaries not found (install postgresql-15 or set SYNCD_PG_BINDIR)"
            )
        if not _has_server(bindir):
            raise PgServerError(f"{bindir} has no executable postgres and initdb (SYNCD_PG_BINDIR?)")
        _sweep_stale()
        root = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (root / _OWNER).write_text(str(os.getpid()))
        try:
            server = cls(bindir=bindir, root=root, durable=durable)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        atexit.register(server.stop)
        try:
            server._chown(server.root)
            server._initdb()
            server._launch()
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        """Fast shutdown (SIGINT: disconnect clients, checkpoint, exit), escalating to SIGKILL
        of the whole session after a timeout; then delete the temp dir. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        try:
            if self._proc is not None:
                self._terminate(self._proc, signal.SIGINT, _STOP_TIMEOUT)
                self._proc = None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid, while it runs."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> PgServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<PgServer {state} port={self.port} root={self.root}>"

    # -- databases ------------------------------------------------------------------------

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@{_HOST}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (lowercase letters, digits, `_`); return its DSN. Runs `psql`
        in a subprocess: it blocks for ~0.1 s, but is safe inside a running event loop."""
        self.psql(f'CREATE DATABASE "{self._check_name(name)}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS `name` WITH (FORCE): connected sessions are terminated."""
        self.psql(f'DROP DATABASE IF EXISTS "{self._check_name(name)}" WITH (FORCE)')

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run one SQL command with `psql` as the superuser; return its unaligned output."""
        if not self.running:
            raise PgServerError(f"{self!r} is not running")
        cmd = [
            str(self.bindir / "psql"),
            "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
            "-h", _HOST, "-p", str(self.port), "-U", self.superuser, "-d", database,
            "-c", sql,
        ]  # fmt: skip
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=_client_env(), timeout=60)
        except subprocess.TimeoutExpired as e:
            raise PgServerError(f"psql timed out after {e.timeout:.0f}s running {sql!r}") from e
        if r.returncode != 0:
            raise PgServerError(f"psql failed ({r.returncode}) running {sql!r}: {r.stderr.strip()}")
        return r.stdout

    @staticmethod
    def _check_name(name: str) -> str:
        if not _DB_NAME.fullmatch(name):
            raise ValueError(
                f"database name {name!r}: use 1-63 lowercase letters, digits and '_', "
                "not starting with a digit"
            )
        return name

    # -- internals ------------------------------------------------------------------------

    def _chown(self, path: Path) -> None:
        if self._uid is not None and self._gid is not None:
            os.chown(path, self._uid, self._gid)

    def _server_env(self) -> dict[str, str]:
        env = _client_env()
        if self._run_as is not None:
            env |= {"HOME": str(self.root), "USER": self._run_as.pw_name}
        return env

    def _initdb(self) -> None:
        cmd = [
            str(self.bindir / "initdb"),
            "-D", str(self.data_dir),
            "-A", "trust", "-U", self.superuser,
            "-E", "UTF8", "--locale=C", "--no-instructions",
        ]  # fmt: skip
        if not self.durable:
            cmd.append("--no-sync")
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
            env=self._server_env(),
            user=self._uid,
            group=self._gid,
            extra_groups=self._groups,
        )
        if r.returncode != 0:
            raise PgServerError(
                f"initdb failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}"
            )

    def _launch(self) -> None:
        """Start the postmaster on a free port; retry on another port if the bind fails."""
        self.socket_dir.mkdir()
        self._chown(self.socket_dir)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self.port = _free_port()
            self._proc = self._spawn()
            if self._wait_ready(self._proc):
                return
            self._proc = None
            log = _tail(self.log_path)
            if "could not create any TCP/IP sockets" in log and attempt < _PORT_ATTEMPTS:
                continue  # the port was taken between _free_port() and the bind
            raise PgServerError(
                f"postgres did not start (port {self.port}, attempt {attempt}); "
                f"server log {self.log_path}:\n{log}"
            )

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [
            str(self.bindir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-k", str(self.socket_dir),
            "-c", f"listen_addresses={_HOST}",
            "-c", "max_connections=200",
        ]  # fmt: skip
        if not self.durable:
            cmd += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the fd
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=self._server_env(),
                user=self._uid,
                group=self._gid,
                extra_groups=self._groups,
                start_new_session=True,  # no terminal SIGINT; stop() can kill the whole group
                preexec_fn=_die_with_parent(),
            )

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        """True once the postmaster reports "ready" in postmaster.pid (what `pg_ctl start -w`
        waits for). False if it exited first; on timeout kill it and raise."""
        pidfile = self.data_dir / "postmaster.pid"
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                lines = pidfile.read_text().splitlines()
            except OSError:
                lines = []
            # line 1: the pid; line 8: the status ("starting", "ready", "stopping", ...)
            pid, status = (lines[0], lines[7]) if len(lines) >= 8 else ("", "")
            if pid.strip() == str(proc.pid) and status.strip() == "ready":
                return True
            time.sleep(0.02)
        self._terminate(proc, signal.SIGQUIT, 5.0)
        raise PgServerError(
            f"postgres did not accept connections within {_START_TIMEOUT:.0f}s "
            f"(port {self.port}); server log {self.log_path}:\n{_tail(self.log_path)}"
        )

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
        """Signal the postmaster and reap it; SIGKILL its whole session if it lingers."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Not yet reaped, so the process group id cannot have been reused.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGQUIT (PostgreSQL's immediate shutdown) when we
    die, even by SIGKILL. Linux only; and only from the main thread, because the "parent" in
    PR_SET_PDEATHSIG is the thread that forked, and a worker thread may exit long before we do.
    It runs after the uid switch, which would otherwise clear the setting."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGQUIT))
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec

