"""``syncd`` as real processes for tests: a hermetic environment, spawn, run to completion,
wait for "ready on URL", and a bounded wait for exit."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """No inherited SYNCD_* overrides, HOME and XDG dirs under ``home``, the hashing embedder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local/share"), PYTHONPATH=str(ROOT),
               SYNCD_EMBEDDING_MODEL="hashing", **extra)
    return env


async def spawn(home: Path, *args: str, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", *args, env=env_for(home, **(env or {})), cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def cli(home: Path, *args: str, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``syncd ARGS`` run to completion: (exit code, stdout, stderr); ``env`` adds variables."""
    proc = await spawn(home, *args, cwd=cwd, env=env)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def wait_ready(proc: asyncio.subprocess.Process, deadline: float = 30.0) -> str:
    """The URL from the process's "ready on URL" line on stderr."""
    assert proc.stderr is not None
    lines: list[str] = []
    async with asyncio.timeout(deadline):
        while True:
            line = (await proc.stderr.readline()).decode()
            if not line:
                raise AssertionError(f"process exited before ready: {''.join(lines)}")
            lines.append(line)
            if "ready on " in line:
                return line.split("ready on ", 1)[1].strip()


async def finish(proc: asyncio.subprocess.Process, limit: float = 30.0) -> tuple[int, str]:
    async with asyncio.timeout(limit):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def stop_all(procs: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM each process still running, newest first; each must then exit 0."""
    import signal
    for proc in reversed(procs):
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        code, err = await finish(proc)
        assert code == 0, err


@asynccontextmanager
async def daemon(home: Path, data: Path | str) -> AsyncIterator[str]:
    """A ``syncd run`` on ``data`` (port 0) for the block; yields its URL. Stopped with
    SIGTERM after it, and it must exit 0."""
    proc = await spawn(home, "--data-dir", str(data), "run", "--listen", "127.0.0.1:0")
    try:
        yield await wait_ready(proc)
    finally:
        await stop_all([proc])
