"""The embedded demo (``syncd demo``): a hub and two laptops with the real embedder, run in a
subprocess exactly as the CLI will run it, checked on the lines it prints."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ("import asyncio, sys; from syncd.demo import run_demo; "
       "sys.exit(asyncio.run(run_demo()))")


async def test_demo_walks_through_and_the_secret_stays_on_a() -> None:
    """ARCHITECTURE §9 demo + P7: A's memories reach B through the hub; the secret is on neither."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RUN, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    lines = [line.strip() for line in text.splitlines()]
    for expected in (
            "B recalled the fact from A: yes",
            "B recalled the procedure from A: yes",
            "secret absent from the hub: yes",
            "secret absent from A's disk: yes (redacted at save time, before any write)",
            "B recalled the scheduled memory: yes",
            "Done: every check held."):
        assert expected in lines, text
    stored = next(line for line in lines if line.startswith("stored:"))
    assert "the deploy key is [redacted]." in stored and "sk-demo-123" not in stored
    assert any(line.startswith("'How often do laptops poll the control plane?': v2 is "
                               "recalled, superseded v1 is filtered out") for line in lines)
    assert any(line.startswith("with include_invalidated=true, v1 comes back marked")
               for line in lines)
    steps = [line.split(".", 1)[0] for line in text.splitlines() if line[:2] in
             {f"{n}." for n in range(1, 10)}]
    assert steps == ["1", "2", "3", "4", "5", "6"], text
