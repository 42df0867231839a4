"""A program that raises with a store still open exits: no thread of the store keeps the
interpreter alive (aiosqlite's reader thread did, until the store was closed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Every thread the store starts does work before the raise: a save (writer, checkpointer),
# an apply of a batch big enough for the hashing thread, a recall (recall reader, query
# thread) and a list (the store's reader).
SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from local_store import HashingEmbedder, Store
    from protocol.rows import NodeRow
    from protocol.timestamp import format_ns

    async def main(data_dir):
        store = await Store.open(data_dir, embedder=HashingEmbedder())
        await store.memories.save({"content": "deploy billing with make release"})
        stamp = format_ns(1_700_000_000_000_000_000)
        rows = [NodeRow(id=f"memory:{i:04d}", labels="Memory", content=f"pulled {i}",
                        status="active", created_at=stamp, updated_at=stamp)
                for i in range(300)]
        await store.replication.apply(rows, [], model=store.embedder.model_id)
        await store.recall.query({"query": "deploy billing"})
        await store.memories.list_memories({})
        raise RuntimeError("boom before close")

    asyncio.run(main(sys.argv[1]))
""")


def test_a_program_that_raises_before_close_exits(tmp_path: Path) -> None:
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data")], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError("the program raised with a store open and never exited") from None
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: boom before close" in proc.stderr
