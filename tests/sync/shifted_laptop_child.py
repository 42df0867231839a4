"""One laptop whose wall clock is shifted (RELIABILITY R10, in a real separate process):
``python shifted_laptop_child.py DATA_DIR HUB_URL TOKEN SHIFT_NS OPS_JSON``.

The laptop's wall clock reads ``time.time_ns() + SHIFT_NS`` — the real clock, a day behind or
ahead — and the hub it talks to runs on the real clock, so the engine learns the offset from
real ``Date`` headers. ``OPS_JSON`` is a list run in order:

  {"op": "sync"}                                  one sync pass
  {"op": "save", "content": C, "topic_key": K}    save (or, when K exists, edit) a memory

Prints one JSON object on stdout: ``offset_ms_at_start`` (the offset restored from an earlier
run, before any pass), ``results`` (one entry per op) and ``rows`` (id → content, updated_at).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: sys.path[0] is tests/sync
    sys.path.insert(0, str(REPO_ROOT))

from tests.sync.harness import Laptop, live_contents, start_laptop  # noqa: E402

NEVER_SECS = 1e12  # anti-entropy never comes due: every delivery goes through `changes`


async def run_op(laptop: Laptop, op: dict[str, Any]) -> dict[str, Any]:
    if op["op"] == "sync":
        report = await laptop.sync()
        return {"op": "sync", "ok": report.ok, "error": report.error,
                "clock_rewound": report.clock_rewound, "pushed_nodes": report.pushed_nodes,
                "pulled_nodes": report.pulled_nodes,
                "offset_ms": laptop.engine.status.clock_offset_ms}
    if op["op"] == "save":
        saved = await laptop.store.memories.save({"content": op["content"], "topic_key": op["topic_key"]})
        row = await laptop.store.memories.get(saved["node_id"])
        return {"op": "save", "id": saved["node_id"], "updated_at": row["updated_at"]}
    raise ValueError(f"unknown op {op!r}")


async def main(argv: list[str]) -> dict[str, Any]:
    data_dir, url, token, shift = Path(argv[0]), argv[1], argv[2], int(argv[3])
    ops: list[dict[str, Any]] = json.loads(argv[4])
    laptop = await start_laptop("child", data_dir, url, token,
                                wall=lambda: time.time_ns() + shift,
                                anti_entropy_secs=NEVER_SECS)
    try:
        at_start = laptop.engine.status.clock_offset_ms
        results = [await run_op(laptop, op) for op in ops]
        rows = {mid: {"content": row[0], "updated_at": row[8]}
                for mid, row in (await live_contents(laptop.store)).items()}
    finally:
        await laptop.close()
    return {"offset_ms_at_start": at_start, "results": results, "rows": rows}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))))
