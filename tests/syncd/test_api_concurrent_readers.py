"""RELIABILITY S2 through a real ``syncd run`` process and its API (the store-level test is
``tests/local_store/test_concurrency.py``)."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from pathlib import Path

import aiohttp

from tests.syncd.processes import cli, env_for, finish, wait_ready

WRITERS, SAVES = 50, 6
LOCKED = "locked"


async def test_s2_api_writers_cli_readers_and_a_backup_never_see_locked(tmp_path: Path) -> None:
    """S2 through the real daemon: 50 concurrent HTTP writers, CLI readers (``recall``,
    ``status``) and ``syncd backup`` halfway: every answer is a success, "database is locked"
    appears nowhere (answers, CLI output, the daemon's log), the backup is whole."""
    data = tmp_path / ".local/share/syncd"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), "run", "--listen", "127.0.0.1:0",
        env=env_for(tmp_path, SYNCD_LOG_LEVEL="debug"), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    url = await wait_ready(proc)
    headers = {"Authorization": f"Bearer {(data / 'api-token').read_text().strip()}"}
    answers: list[tuple[int, str]] = []
    halfway = asyncio.Event()
    cli_out: list[tuple[int, str, str]] = []

    async def writer(w: int, s: aiohttp.ClientSession) -> None:
        for i in range(SAVES):
            async with s.post(url + "/v1/agent/memory/tools/save_memory", headers=headers,
                              json={"content": f"api writer {w} save {i}"}) as r:
                answers.append((r.status, await r.text()))
                if len(answers) >= WRITERS * SAVES // 2:
                    halfway.set()

    async def reader() -> None:
        while not halfway.is_set():
            cli_out.append(await cli(tmp_path, "--data-dir", str(data), "recall", "api writer"))
        cli_out.append(await cli(tmp_path, "--data-dir", str(data), "status"))

    async def backup() -> None:
        await halfway.wait()
        cli_out.append(await cli(tmp_path, "--data-dir", str(data), "backup",
                                 str(tmp_path / "b.db")))

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=WRITERS)) as s:
            await asyncio.gather(*(writer(w, s) for w in range(WRITERS)), reader(), backup())
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    bad = [a for a in answers if a[0] != 200]
    assert bad == [] and len(answers) == WRITERS * SAVES
    assert [c for c in cli_out if c[0] != 0] == []
    assert not any(LOCKED in out + e for _, out, e in cli_out)
    assert "database is locked" not in err and "SQLITE_BUSY" not in err, err[-2000:]
    assert code == 0, err[-2000:]
    conn = sqlite3.connect(tmp_path / "b.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] >= WRITERS * SAVES // 2
    finally:
        conn.close()
