"""Smoke run of the hub benchmark: ``bench/hub.py --quick`` end to end (no timing asserted)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from tests.pgserver import PgServer

ROOT = Path(__file__).resolve().parents[2]
HEADER = ["metric", "n", "p50", "p95", "value", "vs baseline", "target"]
TIMED = ("import, PostgreSQL, 1 hub process", "import, PostgreSQL, 3 hub processes",
         "baseline: import, SQLite hub, 1 process", "changes paging, PostgreSQL, 1 hub process",
         "changes paging, PostgreSQL, 3 hub processes", "baseline: changes paging, SQLite hub")
UNTIMED = ("seed PostgreSQL in-process (PgHubStore.apply)",
           "bootstrap a laptop from a PostgreSQL hub", "laptop peak RSS (bootstrap, VmHWM)",
           "baseline: Store.apply in-process, no vectors")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def positive(cell: str) -> float:
    """The first number in a cell ("1,234 rows/s ok", "12.5 ms", "0.93x"), which must be > 0."""
    found = NUMBER.search(cell)
    assert found is not None, f"no number in {cell!r}"
    value = float(found.group().replace(",", ""))
    assert value > 0, cell
    return value


async def test_bench_hub_quick_prints_its_table(pg_server: PgServer) -> None:
    """ARCHITECTURE §2 bench/: the hub benchmark runs (PostgreSQL, hub processes, a laptop) and
    prints every row of its table. ``pg_server`` only gates the test on PostgreSQL binaries
    (skip, or fail in CI); the bench starts its own server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "hub.py"), "--quick", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(240):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # timed out: the bench stops its own server on SIGTERM
            proc.terminate()
            await proc.wait()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("metric"))
    assert [cell.strip() for cell in header.split("|")] == HEADER
    rows = {cells[0]: cells for line in lines if "|" in line and not line.startswith("metric")
            for cells in [[c.strip() for c in line.split("|")]]}
    assert set(TIMED) | set(UNTIMED) <= set(rows), text
    for name in TIMED:
        n, p50, p95, value, ratio, _ = rows[name][1:]
        for cell in (n, p50, p95, value, ratio):
            positive(cell)
    for name in UNTIMED:
        positive(rows[name][1])  # n
        positive(rows[name][4])  # value
    assert any(line.startswith("note: bootstrap pass:") for line in lines), text
    assert lines[-1].startswith("run time:"), text
