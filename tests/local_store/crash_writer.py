"""Crash-loop writer (RELIABILITY S1): ``python crash_writer.py DATA_DIR ACK_FILE``.

Opens the store, prints ``ready`` and then writes forever, alternating one ``save`` and one
``save_many`` of five memories that share a batch tag. After each write returns (= is acked) it
appends one line to ACK_FILE and fsyncs it:

    single <node_id>
    batch <batch-name> <node_id> × 5

The batch name embeds a random run id, so batches of different runs never collide and no
content ever repeats (exact-duplicate dedupe never fires). The test kills this process with
SIGKILL at a random point and checks that the store kept every acked write, whole.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path

from local_store import HashingEmbedder, Store

REALM = "crash"
BATCH_SIZE = 5


class AckLog:
    """An append-only file whose every line is on disk before ``append`` returns."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def append(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def batch_tag(name: str) -> str:
    return f"batch-{name}"


async def run(data_dir: Path, ack_path: Path) -> None:
    run_id = secrets.token_hex(6)
    acks = AckLog(ack_path)
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    n = 0
    while True:  # until SIGKILL
        n += 1
        single = await store.memories.save({"content": f"single {run_id} {n}", "realm": REALM,
                                   "tags": ["single"]})
        acks.append(f"single {single['node_id']}")
        name = f"{run_id}-{n}"
        result = await store.memories.save_many([
            {"content": f"batch {name} item {i}", "realm": REALM, "tags": [batch_tag(name)]}
            for i in range(BATCH_SIZE)])
        ids = result["ids"]
        if len(ids) != BATCH_SIZE or not all(ids) or result.get("errors"):
            raise SystemExit(f"save_many returned {result!r}")
        acks.append(f"batch {name} " + " ".join(f"memory:{i}" for i in ids))


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: crash_writer.py DATA_DIR ACK_FILE")
    asyncio.run(run(Path(sys.argv[1]), Path(sys.argv[2])))


if __name__ == "__main__":
    main()
