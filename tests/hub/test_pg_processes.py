"""Several ``syncd hub`` processes on one PostgreSQL database, as real processes.

  * 3 hub processes, 6 concurrent importers and 3 readers paging ``changes`` (each page from
    another process): every reader sees every committed row exactly once. The whole round
    repeats ``SYNCD_HUB_CONCURRENCY_RUNS`` times in a row (3 in ``make test``, 20 in
    ``make soak``).
  * kill -9 of a hub in the middle of an import: no partial batch is ever visible, and the
    importer's retry lands the whole batch once.
"""

from __future__ import annotations

import asyncio
import collections
import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from protocol.timestamp import format_ns, parse_ns
from tests.syncd.processes import cli, spawn, wait_ready

RUNS = int(os.environ.get("SYNCD_HUB_CONCURRENCY_RUNS", "3"))
HUBS, IMPORTERS, READERS = 3, 6, 3
BATCHES, ROWS, PAGE = 4, 40, 25
BASE = parse_ns("2026-11-01T10:00:00Z")
JSON = {"Content-Type": "application/json"}


class HubProcess:
    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc, self.url = proc, url
        self.log: list[str] = []
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:  # a full stderr pipe would stall the hub
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.log.append(line.decode())

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await self.proc.wait()
        await self._drain


async def start_hubs(home: Path, count: int, *where: str) -> list[HubProcess]:
    procs = [await spawn(home, "hub", *where, "--listen", "127.0.0.1:0") for _ in range(count)]
    try:
        return [HubProcess(p, await wait_ready(p)) for p in procs]
    except BaseException:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        raise


async def store_file(tmp_path: Path, dsn: str) -> Path:
    path = tmp_path / "hub.dsn"
    await asyncio.to_thread(path.write_text, f"# the hub's database\n{dsn}\n")
    await asyncio.to_thread(path.chmod, 0o600)
    return path


async def new_token(home: Path, *where: str) -> str:
    code, out, err = await cli(home, "hub", "token", "create", *where, "--role", "write",
                               "--name", "importers")
    assert code == 0, err
    return out.strip()


def rows(tag: str, count: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": f"memory:{tag}-{i}", "content": f"{tag} row {i}: queue {i % 7} belongs to team",
         "updated_at": format_ns(BASE + i), "origin": f"laptop-{tag.split('-')[0]}"}
        for i in range(count)]
    nodes.append({"id": f"memory:{tag}-bad", "content": "no version"})  # reported, skipped
    edges = [{"id": f"memory:{tag}-0->repo:syncd:RELATES_TO", "src": f"memory:{tag}-0",
              "dst": "repo:syncd", "type": "RELATES_TO", "created_at": format_ns(BASE)}]
    return {"memory_nodes": nodes, "memory_edges": edges}


async def test_three_hubs_six_importers_three_readers_see_every_row_exactly_once(
        tmp_path: Path, pg_dsn: str) -> None:
    where = ("--store-file", str(await store_file(tmp_path, pg_dsn)))
    token = await new_token(tmp_path, *where)
    hubs = await start_hubs(tmp_path, HUBS, *where)
    urls = [h.url for h in hubs]
    try:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {token}"}) as http:
            cursors: list[str | None] = [None] * READERS
            for run in range(RUNS):
                expected: set[str] = set()
                for i in range(IMPORTERS):
                    for b in range(BATCHES):
                        expected |= {f"memory:{i}-{run}-{b}-{r}" for r in range(ROWS)}
                        expected.add(f"memory:{i}-{run}-{b}-0->repo:syncd:RELATES_TO")
                done = asyncio.Event()

                async def importer(i: int, run: int = run) -> None:
                    for b in range(BATCHES):
                        url = urls[(i + b) % HUBS]
                        async with http.post(f"{url}/v1/agent/memory/import",
                                             json=rows(f"{i}-{run}-{b}", ROWS)) as resp:
                            body = await resp.json()
                            assert resp.status == 200, body
                        assert (body["applied_nodes"], body["applied_edges"]) == (ROWS, 1), body
                        assert [(e["index"], e["field"]) for e in body["row_errors"]] == [
                            (ROWS, "updated_at")]

                async def reader(j: int, done: asyncio.Event = done) -> list[str]:
                    seen: list[str] = []
                    page = 0
                    while True:
                        finished = done.is_set()  # read to the end once more after this
                        while True:
                            url = urls[(j + page) % HUBS]  # any process serves any page
                            page += 1
                            params = {"limit": str(PAGE)}
                            if cursors[j] is not None:
                                params["since"] = cursors[j] or ""
                            async with http.get(f"{url}/v1/agent/memory/changes",
                                                params=params) as resp:
                                body = await resp.json()
                                assert resp.status == 200, body
                            seen += [n["id"] for n in body["memory_nodes"]]
                            seen += [e["id"] for e in body["memory_edges"]]
                            cursors[j] = body["until"]
                            if not body["has_more"]:
                                break
                        if finished:
                            return seen
                        await asyncio.sleep(0.01)

                readers = [asyncio.create_task(reader(j)) for j in range(READERS)]
                await asyncio.gather(*(importer(i) for i in range(IMPORTERS)))
                done.set()
                for j, seen in enumerate(await asyncio.gather(*readers)):
                    twice = [k for k, n in collections.Counter(seen).items() if n > 1]
                    assert not twice, f"run {run}, reader {j}: seen twice: {twice[:5]}"
                    assert set(seen) == expected, (
                        f"run {run}, reader {j}: missing {sorted(expected - set(seen))[:5]}, "
                        f"extra {sorted(set(seen) - expected)[:5]}")
    finally:
        for hub in hubs:
            await hub.stop()
    for hub in hubs:
        assert hub.proc.returncode == 0, "".join(hub.log)


async def test_kill_9_mid_import_leaves_no_partial_batch(tmp_path: Path, pg_dsn: str) -> None:
    where = ("--store", pg_dsn)
    token = await new_token(tmp_path, *where)
    (hub,) = await start_hubs(tmp_path, 1, *where)
    batch = json.dumps(rows("big", 20_000)).encode()
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {token}"}) as http:
            async def post() -> None:
                async with http.post(f"{hub.url}/v1/agent/memory/import",
                                     data=io.BytesIO(batch), headers=JSON) as resp:
                    await resp.read()

            sending = asyncio.create_task(post())
            async with asyncio.timeout(60):  # until the hub is writing the batch
                while not await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'syncd-hub' AND state = 'active' AND query LIKE 'INSERT INTO memories%'"):
                    assert not sending.done(), "the import finished before it could be killed"
                    await asyncio.sleep(0.002)
            assert await conn.fetchval("SELECT count(*) FROM memories") == 0  # not committed
            hub.proc.kill()
            await hub.stop()
            try:
                await sending
            except aiohttp.ClientError:
                pass  # the connection died with the hub
            for _ in range(1200):  # the server notices the client is gone
                if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE "
                                           "application_name = 'syncd-hub'"):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the killed hub's sessions never ended")
            landed = await conn.fetchval("SELECT count(*) FROM memories")
            marks = await conn.fetchval("SELECT count(*) FROM feed_tx")
            assert (landed, marks) in ((0, 0), (20_000, 1)), (landed, marks)  # never partial

            (again,) = await start_hubs(tmp_path, 1, *where)
            try:
                async with http.post(f"{again.url}/v1/agent/memory/import",
                                     data=io.BytesIO(batch), headers=JSON) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                assert body["applied_nodes"] == 20_000 - landed
                seen: list[str] = []
                since = ""
                while True:
                    async with http.get(f"{again.url}/v1/agent/memory/changes",
                                        params={"since": since, "limit": "5000"}) as resp:
                        page = await resp.json()
                    seen += [n["id"] for n in page["memory_nodes"]]
                    since = page["until"]
                    if not page["has_more"]:
                        break
                assert len(seen) == len(set(seen)) == 20_000
            finally:
                await again.stop()
    finally:
        await conn.close()
        if hub.proc.returncode is None:  # a failed assertion must not leave a hub running
            hub.proc.kill()
            await hub.stop()
