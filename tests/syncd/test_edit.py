"""``syncd edit`` and ``PATCH /v1/agent/memory/items/{id}`` (issue 35): a memory's text in the
person's editor, or the fields given, saved as an edit that keeps the id and syncs; bad input
names the field and changes nothing."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import aiohttp

from local_store import Store, ValidationError
from syncd.token import read_token, token_path
from tests.store_probe import dump_tables, outbox_items
from tests.syncd.processes import cli, daemon


async def editor_script(tmp_path: Path, body: str) -> str:
    """An executable ``$EDITOR``: a shell script run with the file to edit as $1."""
    script = tmp_path / "editor.sh"
    await asyncio.to_thread(script.write_text, f"#!/bin/sh\n{body}\n")
    await asyncio.to_thread(script.chmod, stat.S_IRWXU)
    return str(script)


async def test_edit_in_the_editor_or_by_flags_keeps_the_id(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = ("--data-dir", str(data))
    async with daemon(tmp_path, data) as url:
        code, out, err = await cli(tmp_path, *base, "save", "deploy with make ship",
                                   "--realm", "billing", "--tag", "ops")
        assert code == 0, err
        mid = out.split()[-1]

        editor = await editor_script(tmp_path, 'sed -i "s/make ship/make release/" "$1"')
        code, out, err = await cli(tmp_path, *base, "edit", mid, env={"EDITOR": editor,
                                                                      "VISUAL": ""})
        assert (code, out) == (0, f"edited {mid} (content)\n"), err
        code, out, err = await cli(tmp_path, *base, "get", mid, "--json")
        memory = json.loads(out)
        assert memory["content"] == "deploy with make release" and memory["tags"] == ["ops"]
        assert memory["realm"] == "billing"
        code, out, err = await cli(tmp_path, *base, "recall", "make release", "--json")
        assert [m["id"] for m in json.loads(out)["memories"]][:1] == [mid], out

        unchanged = await editor_script(tmp_path, "true")
        code, out, err = await cli(tmp_path, *base, "edit", mid, env={"VISUAL": unchanged})
        assert (code, out) == (0, f"no change to {mid}; nothing saved\n"), err
        failing = await editor_script(tmp_path, "exit 3")
        code, out, err = await cli(tmp_path, *base, "edit", mid, env={"VISUAL": failing})
        assert code == 1 and "exited 3; nothing saved" in err, err

        code, out, err = await cli(tmp_path, *base, "edit", mid, "--title", "Deploying",
                                   "--tag", "ops", "--tag", "release", "--importance", "0.9",
                                   "--json")
        assert code == 0, err
        assert json.loads(out)["changed"] == ["title", "tags", "importance"], out
        code, out, err = await cli(tmp_path, *base, "get", mid, "--json")
        memory = json.loads(out)
        assert (memory["title"], memory["tags"], memory["importance"]) == (
            "Deploying", ["ops", "release"], 0.9)
        assert memory["content"] == "deploy with make release"

        token = await asyncio.to_thread(read_token, token_path(data))
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            item = f"{url}/v1/agent/memory/items/{mid}"
            for body, field in (({"content": "  "}, "content"), ({"realm": "web"}, "realm"),
                                ({}, "body"), ({"importance": "high"}, "importance")):
                async with http.patch(item, json=body) as resp:
                    assert resp.status == 422, body
                    assert (await resp.json())["error"]["field"] == field, body
            async with http.patch(f"{url}/v1/agent/memory/items/memory:nope",
                                  json={"title": "x"}) as resp:
                assert resp.status == 404
            async with http.patch(item, json={"content": "keys <private>hunter2</private> "
                                              "rotate monthly"}) as resp:
                assert resp.status == 200
            async with http.get(item) as resp:
                assert "hunter2" not in json.dumps(await resp.json())
        code, out, err = await cli(tmp_path, *base, "get", mid, "--json")
        assert json.loads(out)["title"] == "Deploying"  # the refused edits changed nothing


async def test_an_edit_is_a_new_version_in_the_outbox(tmp_path: Path) -> None:
    async with await Store.open(tmp_path) as store:
        saved = await store.memories.save({"content": "the queue is SQS", "realm": "billing"})
        before = await store.memories.get(saved["id"])
        await store.memories.edit(saved["id"], {"content": "the queue is SQS with a DLQ"})
        after = await store.memories.get(saved["id"])
        assert after["updated_at"] > before["updated_at"]
        assert after["created_at"] == before["created_at"] and after["realm"] == "billing"
        assert [(kind, item) for kind, item, _ in await outbox_items(store)] == [
            ("node", after["id"])]
        found = await store.recall.query({"query": "DLQ"})
        assert [m.id for m in found.memories][:1] == [after["id"]]
        dump = await dump_tables(store)
        try:
            await store.memories.edit(saved["id"], {"tags": "a,b", "importance": 7, "memory_type": "x"})
            raise AssertionError("an unknown field was taken")
        except ValidationError as exc:
            assert exc.field == "memory_type"
        assert await dump_tables(store) == dump
