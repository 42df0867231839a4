"""Smoke run of the sync benchmark: ``bench/sync.py --quick`` end to end (no timing asserted)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = ["metric", "n", "p50", "p95", "value", "vs baseline", "target"]
METRICS = ("save → recallable on B, defaults (long-poll)",
           "interval 1 s, no long-poll (B ticks 0.5 s after A)",
           "interval 1 s, no long-poll (same phase: worst)",
           "baseline: save, sync/run A, sync/run B, recall",
           "bootstrap 500 memories + vectors", "idle pass (after sync)",
           "baseline: GET /healthz on the hub", "push 500 local memories (one pass)",
           "baseline: Store.apply in-process, 384-d")


async def test_bench_sync_quick_prints_its_table() -> None:
    """ARCHITECTURE §2 bench/: the sync benchmark runs (hub, daemons, passes) and prints its table."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "sync.py"), "--quick", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(180):
        out, err = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("metric"))
    assert [cell.strip() for cell in header.split("|")] == HEADER
    rows = {line.split("|")[0].strip() for line in lines if "|" in line}
    assert set(METRICS) <= rows, text
    assert any(line.startswith("note: bootstrap pass:") for line in lines), text
    assert lines[-1].startswith("run time:"), text
