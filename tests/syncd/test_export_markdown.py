"""``syncd export --format markdown`` and ``GET /v1/agent/memory/export?format=markdown``
(issue 35): one section per live memory with its fields and edges, content quoted so its own
Markdown cannot break the file, no vectors; JSON stays what ``import`` takes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from syncd.token import read_token, token_path
from tests.syncd.processes import cli, daemon

STAMP = "2026-11-30T08:15:42.123456789+00:00"
LATER = "2026-12-01T09:00:00.000000000+00:00"

ROWS = {
    "memory_nodes": [
        {"id": "memory:deploy", "title": "How to deploy", "content": "Run make ship.\n"
         "## not a heading\n- not a list", "realm": "billing", "memory_type": "procedure",
         "tags": "ops,deploy", "importance": 0.8, "updated_at": STAMP, "valid_at": STAMP,
         "embedding": [0.5] * 384},
        {"id": "memory:queue", "content": "\n  The queue is SQS.\nIt retries thrice.",
         "realm": "billing", "updated_at": STAMP, "topic_key": "queue"},
        {"id": "memory:old", "content": "The queue was RabbitMQ.", "realm": "billing",
         "updated_at": STAMP, "valid_at": STAMP, "invalid_at": LATER,
         "superseded_by": "memory:queue"},
        {"id": "memory:standup", "content": "Standup is at ten.", "realm": "team",
         "updated_at": STAMP},
        {"id": "memory:gone", "content": "deleted text", "realm": "billing",
         "updated_at": STAMP, "deleted": True},
    ],
    "memory_edges": [{"id": "memory:deploy->memory:queue:DEPENDS_ON", "src": "memory:deploy", "dst": "memory:queue",
                      "type": "DEPENDS_ON", "created_at": STAMP}],
}

DEPLOY = """
## How to deploy

- id: `memory:deploy`
- type: procedure
- realm: billing
- tags: ops, deploy
- importance: 0.8
- status: active
- written: 2026-11-30 08:15:42 UTC
- valid: 2026-11-30 08:15:42 UTC to now
- DEPENDS_ON → `memory:queue`

> Run make ship.
> ## not a heading
> - not a list
"""

QUEUE_HEAD = "\n## The queue is SQS.\n\n- id: `memory:queue`\n"
OLD_FIELDS = ("- valid: 2026-11-30 08:15:42 UTC to 2026-12-01 09:00:00 UTC\n"
              "- superseded by: `memory:queue`\n")


async def test_markdown_export_reads_as_sections_and_import_refuses_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with daemon(tmp_path, data) as url:
        rows = tmp_path / "rows.json"
        rows.write_text(json.dumps(ROWS))
        code, out, err = await cli(tmp_path, "--data-dir", str(data), "import", str(rows))
        assert code == 0, err

        code, md, err = await cli(tmp_path, "export", "--format", "markdown", "--data-dir",
                                  str(data))
        assert code == 0, err
        assert md.startswith("# syncd memories\n\n4 memories.\n"), md  # no tombstone
        assert DEPLOY in md, md
        assert QUEUE_HEAD in md and "- topic key: queue\n" in md, md
        assert "- ← DEPENDS_ON from `memory:deploy`\n" in md, md
        assert ">\n>   The queue is SQS.\n> It retries thrice.\n" in md, md
        assert OLD_FIELDS in md, md
        assert "deleted text" not in md and "0.5, 0.5" not in md, md
        headings = [line for line in md.splitlines() if line.startswith("#")]
        assert headings == ["# syncd memories", "## How to deploy", "## The queue is SQS.",
                            "## The queue was RabbitMQ.", "## Standup is at ten."], headings

        out_file = tmp_path / "memories.md"
        code, _, err = await cli(tmp_path, "--data-dir", str(data), "export", "--format",
                                 "markdown", "--realm", "team", "-o", str(out_file))
        assert code == 0 and f"exported 1 memories and 1 edges to {out_file}" in err, err
        team = out_file.read_text()
        assert team.startswith("# syncd memories\n\n1 memories in realm team.\n"), team
        assert "## Standup is at ten." in team and "How to deploy" not in team, team

        before = await cli(tmp_path, "--data-dir", str(data), "export")
        code, out, err = await cli(tmp_path, "--data-dir", str(data), "import", str(out_file))
        assert (code, out) == (1, ""), (out, err)
        assert err == (f"syncd: {out_file}: this is a Markdown export, for reading; `syncd "
                       "import` takes the JSON export (`syncd export`, --format json)\n"), err
        after = await cli(tmp_path, "--data-dir", str(data), "export")
        assert json.loads(after[1])["memory_nodes"] == json.loads(before[1])["memory_nodes"]

        token = await asyncio.to_thread(read_token, token_path(data))
        auth = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with http.get(f"{url}/v1/agent/memory/export?format=yaml") as resp:
                assert resp.status == 422
                assert (await resp.json())["error"]["field"] == "format"
            async with http.get(f"{url}/v1/agent/memory/export?format=markdown") as resp:
                assert resp.content_type == "text/markdown"
                assert resp.headers["X-Syncd-Memories"] == "4"
                assert await resp.text() == md
