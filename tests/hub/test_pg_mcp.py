"""MCP across several ``syncd hub`` processes on one PostgreSQL database (issue 31, point 5;
``syncd/hub/workcopy.py``): a memory saved through one process is found, read and judged
through another, and the usage counters every process counts into are one table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from tests.hub.test_current_surface import Hub, new_token
from tests.hub.test_pg_processes import start_hubs, store_file


@asynccontextmanager
async def pg_hubs(tmp_path: Path, pg_dsn: str, count: int) -> AsyncIterator[list[Hub]]:
    """``count`` hub processes on one database, each as a ``Hub`` with a read and a write
    token; stopped on the way out."""
    where = ("--store-file", str(await store_file(tmp_path, pg_dsn)))
    read, write = await new_token(tmp_path, where, "read"), await new_token(tmp_path, where,
                                                                            "write")
    processes = await start_hubs(tmp_path, count, *where)
    try:
        async with aiohttp.ClientSession() as http:
            yield [Hub(p.url, "postgresql", read, write, http) for p in processes]
    finally:
        for process in processes:
            await process.stop()


async def test_two_processes_serve_one_memory_and_share_its_counters(
        tmp_path: Path, pg_dsn: str) -> None:
    async with pg_hubs(tmp_path, pg_dsn, 2) as (one, two):
        read, write = one.read, one.write
        saved = await one.tool(write, "save_memory", realm="p",
                               content="the staging database is rebuilt every Monday")
        mid = saved["node_id"]
        # process two made its copy after the save, and one saves again after it has
        await two.tool(read, "list_memories")
        other = (await one.tool(write, "save_memory", realm="p",
                                content="the staging cache is flushed every Friday"))[
            "node_id"]
        found = await two.tool(read, "memory_search", query="staging database Monday",
                               realms=["p"])
        assert mid in [m["id"] for m in found["memories"]], found
        assert (await two.tool(read, "get_memory", memory_id=other))["id"] == other
        status, answer = await one.call("POST", "/v1/agent/memory/query", read,
                                        {"query": "staging database Monday",
                                         "realms": ["p"], "limit": 1})
        assert status == 200 and [m["id"] for m in answer["memories"]] == [mid]

        usage = (await one.tool(read, "list_memory_usage", realm="p"))["memories"]
        hits = {u["memory_id"]: u["hit_count"] for u in usage}
        assert hits[mid] == 2, usage  # two's search and one's query
        verdict = await two.tool(write, "reinforce_memory", memory_id=mid,
                                 outcome="helpful")
        assert (verdict["hit_count"], verdict["reinforced_count"]) == (2, 1), verdict
        left = (await one.tool(read, "list_memory_usage", realm="p"))["memories"]
        assert mid not in {u["memory_id"] for u in left}

        # a delete through one: two no longer finds it
        deleted = await one.tool(write, "delete_memory", memory_id=mid)
        assert "error" not in deleted, deleted
        again = await two.tool(read, "memory_search", query="staging database Monday",
                               realms=["p"])
        assert mid not in [m["id"] for m in again["memories"]], again


async def test_a_tool_argument_holding_nul_is_refused_by_field_and_nothing_is_stored(
        tmp_path: Path, pg_dsn: str) -> None:
    """PostgreSQL text cannot hold U+0000: the call is refused naming the field, instead of a
    "saved" answer for a memory the database then refuses on every push."""
    async with pg_hubs(tmp_path, pg_dsn, 1) as (hub,):
        read, write = hub.read, hub.write
        refused = await hub.tool(write, "save_memory", realm="p", content="a\x00b")
        assert refused["error"]["field"] == "content", refused
        tagged = await hub.tool(write, "save_memory", realm="p", content="fine",
                                tags=["ok", "bad\x00"])
        assert tagged["error"]["field"] == "tags[1]", tagged
        assert (await hub.tool(read, "list_memories", realm="p"))["rows"] == []
