"""``--json`` on every command that prints a result (issue 35): one JSON document on stdout,
the same facts the text gives, for scripts. (``status``, ``recall``, ``sync``, ``list``,
``get``, ``delete``, ``stop``, ``join``, ``license install`` are tested beside their text.)"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from tests.syncd.processes import cli, finish, spawn, wait_ready

STAMP = "2026-11-30T08:15:42.123456789+00:00"


async def test_save_import_open_backup_and_restore_print_json(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = ("--data-dir", str(data))
    proc = await spawn(tmp_path, *base, "run", "--listen", "127.0.0.1:0")
    try:
        await wait_ready(proc)
        code, out, err = await cli(tmp_path, *base, "save", "deploy with make ship", "--json")
        assert code == 0, err
        saved = json.loads(out)
        assert saved["node_id"].startswith("memory:") and not saved.get("upserted"), saved

        rows = tmp_path / "rows.json"
        rows.write_text(json.dumps({"memory_nodes": [
            {"id": "memory:n1", "content": "the queue is SQS", "updated_at": STAMP},
            {"id": "memory:n2", "content": "x", "updated_at": "yesterday"}],
            "memory_edges": []}))
        code, out, err = await cli(tmp_path, *base, "import", str(rows), "--json")
        assert code == 1, err  # one row refused
        report = json.loads(out)
        assert report["applied"] == {"memories": 1, "edges": 0}, report
        assert report["unchanged"] == 0 and len(report["refused"]) == 1, report
        assert report["refused"][0].startswith("memory_nodes[1] (memory:n2)"), report

        code, out, err = await cli(tmp_path, *base, "open", "--json")
        assert code == 0, err
        opened = json.loads(out)
        assert opened["url"].startswith("http://127.0.0.1:") and opened["expires_in"] > 0

        copy = tmp_path / "copy.db"
        code, out, err = await cli(tmp_path, *base, "backup", str(copy), "--json")
        assert code == 0, err
        assert json.loads(out) == {"memories": 2, "dest": str(copy), "integrity_check": "ok"}
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err
    code, out, err = await cli(tmp_path, *base, "restore", str(copy), "--json")
    assert code == 0, err
    restored = json.loads(out)
    assert restored["memories"] == 2 and restored["source"] == str(copy), restored
    assert restored["data_dir"] == str(data) and restored["other_install"] is False, restored
    assert restored["replaced"] is not None, restored
    assert await asyncio.to_thread(Path(restored["replaced"]).exists), restored
