"""What only the PostgreSQL hub store has: migrations under concurrent start-up, several
stores (as several processes would hold) on one database, the DSN file, an unreachable
database, and a ``pg_dump``/``pg_restore`` cycle that laptops detect and repair."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from local_store import HashingEmbedder
from protocol.query import QueryRequest
from protocol.rows import NodeRow
from protocol.timestamp import format_ns, parse_ns
from syncd.hub.app import create_hub_app
from syncd.hub.dsn import read_store_file, resolve_dsn
from syncd.hub.pg import PgHubStore
from syncd.hub.pg import follow as pg_follow_module
from syncd.hub.pg.migrate import SchemaError, migrations
from syncd.hub.store import PageSession, StoreUnavailableError
from syncd.hub.tokens import token_hash
from tests.pgserver import PgServer
from tests.sync.harness import live_contents, start_laptop

MODEL = HashingEmbedder().model_id
BASE = parse_ns("2026-11-01T10:00:00Z")


def node(mid: str, content: str, n: int, origin: str = "laptop-a") -> NodeRow:
    return NodeRow(id=mid, content=content, updated_at=format_ns(BASE + n), origin=origin,
                   embedding=list(HashingEmbedder().embed([content])[0]))


async def open_store(dsn: str) -> PgHubStore:
    return await PgHubStore.open(dsn, embedder=HashingEmbedder())


async def test_concurrent_first_starts_migrate_once(pg_dsn: str) -> None:
    stores = await asyncio.gather(*(open_store(pg_dsn) for _ in range(4)))
    try:
        assert len({s.store_id for s in stores}) == 1
        conn = await asyncpg.connect(pg_dsn)
        try:
            applied = await conn.fetch("SELECT version FROM hub_schema ORDER BY version")
        finally:
            await conn.close()
        known = await asyncio.to_thread(migrations)
        assert [r[0] for r in applied] == [v for v, _, _ in known]
    finally:
        for s in stores:
            await s.close()


async def test_a_schema_from_a_newer_syncd_is_refused(pg_dsn: str) -> None:
    await (await open_store(pg_dsn)).close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("INSERT INTO hub_schema (version, name) VALUES (9999, 'future')")
    finally:
        await conn.close()
    with pytest.raises(SchemaError, match="newer than this syncd knows"):
        await open_store(pg_dsn)


async def test_a_database_from_before_page_sessions_gains_them_and_keeps_its_tokens(
        pg_dsn: str) -> None:
    """A hub database migrated by an older syncd (schema 1) is brought to the page-session
    table (0002) on start; its tokens sign in as before."""
    (v1, name, sql), *_ = await asyncio.to_thread(migrations)
    assert v1 == 1
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("CREATE TABLE hub_schema (version integer PRIMARY KEY, name text "
                           "NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        await conn.execute(sql)
        await conn.execute("INSERT INTO hub_schema (version, name) VALUES (1, $1)", name)
        await conn.execute("INSERT INTO tokens (sha256, name, role, plan, created_at) VALUES "
                           "($1, 'old', 'read', 'pro', '2026-01-01T00:00:00Z')",
                           token_hash("syncd_old"))
    finally:
        await conn.close()
    store = await open_store(pg_dsn)
    runner = web.AppRunner(create_hub_app(store))
    try:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.post(url + "/ui/login", json={"token": "syncd_old"}) as resp:
                assert resp.status == 200, await resp.text()
                key = (await resp.json())["csrf"]  # the page sends it with the cookie
            async with http.get(url + "/ui/session",  # the jar sends the cookie
                                headers={"X-CSRF-Token": key}) as resp:
                assert resp.status == 200 and (await resp.json())["name"] == "old"
    finally:
        await runner.cleanup()
        await store.close()
    conn = await asyncpg.connect(pg_dsn)
    try:
        applied = [r[0] for r in await conn.fetch("SELECT version FROM hub_schema ORDER BY 1")]
        assert await conn.fetchval("SELECT count(*) FROM page_sessions") == 1
    finally:
        await conn.close()
    assert applied == [v for v, _, _ in await asyncio.to_thread(migrations)]
    assert applied[-1] >= 2


async def test_sign_ins_with_one_token_through_several_processes_keep_its_cap(
        pg_dsn: str) -> None:
    """Concurrent sign-ins with one token, through two processes, take turns on the token: it
    ends with its newest ``keep`` sessions, never more; another token's session stays."""
    one, two = await open_store(pg_dsn), await open_store(pg_dsn)
    try:
        now = time.time_ns()
        admin = token_hash(await one.tokens.create(role="admin", name="admin"))
        reader = token_hash(await one.tokens.create(role="read", name="reader"))
        await one.add_page_session(token_hash("admin session"),
                                   PageSession(admin, "a", now + 10**12), now_ns=now, keep=3)
        await asyncio.gather(*(
            (one if n % 2 else two).add_page_session(
                token_hash(f"session {n}"), PageSession(reader, str(n), now + 10**12),
                now_ns=now, keep=3) for n in range(24)))
        conn = await asyncpg.connect(pg_dsn)
        try:
            kept = await conn.fetch("SELECT token_sha256, count(*) FROM page_sessions "
                                    "GROUP BY 1")
        finally:
            await conn.close()
        assert dict(kept) == {admin: 1, reader: 3}
    finally:
        await one.close()
        await two.close()


async def test_two_processes_importing_one_id_keep_the_same_winner(pg_dsn: str) -> None:
    one, two = await open_store(pg_dsn), await open_store(pg_dsn)
    try:
        versions = [node("memory:x", f"version {n}", n, origin=f"laptop-{n % 3}")
                    for n in range(1, 41)]
        await asyncio.gather(*(
            (one if n % 2 else two).apply([v], [], model=MODEL)
            for n, v in enumerate(reversed(versions))))
        nodes, _ = await one.export()
        assert [(n.id, n.content) for n in nodes] == [("memory:x", "version 40")]
    finally:
        await one.close()
        await two.close()


async def test_feed_pages_stay_bounded_over_many_vector_only_transactions(pg_dsn: str) -> None:
    store = await open_store(pg_dsn)
    try:
        bare = [NodeRow(id=f"memory:bare-{i}", content=f"pushed without a vector {i}",
                        updated_at=format_ns(BASE + i)) for i in range(10)]
        await store.apply(bare, [], model=MODEL)
        _, _, since, _ = await store.feed(None)
        assert await store.reembed_missing(batch=1) == 10  # ten marks without rows
        for b in range(5):
            await store.apply([node(f"memory:{b}-{i}", f"batch {b} row {i}", 1)
                               for i in range(2)], [], model=MODEL)
        sizes, seen = [], []
        for _ in range(100):
            nodes, _, since, more = await store.feed(since, limit=3)
            sizes.append(len(nodes))
            seen += [n.id for n in nodes]
            if not more:
                break
        assert max(sizes) <= 4, sizes  # one import may end a page past the limit, no more
        assert sorted(seen) == sorted(f"memory:{b}-{i}" for b in range(5) for i in range(2))
    finally:
        await store.close()


async def test_a_starting_process_loads_every_vector_in_bounded_reads(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = await open_store(pg_dsn)
    try:
        for b in range(6):
            await writer.apply([node(f"memory:{b}-{i}", f"batch {b} note {i}", 1)
                                for i in range(5)], [], model=MODEL)
        await writer.apply([node("memory:0-0", "batch 0 note 0 edited", 2)], [], model=MODEL)
        await writer.apply([NodeRow(id="memory:1-0", content="gone", deleted=True,
                                    updated_at=format_ns(BASE + 3))], [], model=MODEL)
    finally:
        await writer.close()
    monkeypatch.setattr("syncd.hub.pg.recall.ROWS_PER_READ", 7)  # two 5-row imports per read
    reads: list[int] = []
    original = asyncpg.pool.PoolConnectionProxy.fetch

    async def counting(self: asyncpg.pool.PoolConnectionProxy, query: str, *args: object,
                       **kw: object) -> list[asyncpg.Record]:
        found = await original(self, query, *args, **kw)  # type: ignore[arg-type]
        if "FROM vectors v JOIN feed_tx" in query:
            reads.append(len(found))
        return found

    monkeypatch.setattr(asyncpg.pool.PoolConnectionProxy, "fetch", counting)
    reader = await PgHubStore.open(pg_dsn, embedder=HashingEmbedder(), follow=False)
    try:
        expected = {f"memory:{b}-{i}" for b in range(6) for i in range(5)} - {"memory:1-0"}
        assert set(reader.vectors.index.ids) == expected
        assert len(reads) >= 3 and max(reads) <= 10, reads  # never all 30 at once
    finally:
        await reader.close()


async def test_another_processes_vectors_and_token_changes_reach_this_one(pg_dsn: str) -> None:
    writer, reader = await open_store(pg_dsn), await open_store(pg_dsn)
    try:
        raw = await writer.tokens.create(role="read", name="shared")
        assert await reader.tokens.authenticate(f"Bearer {raw}", "read") == ("shared", "read")
        await writer.apply([node("memory:k8s", "kubernetes autoscaler settings", 1)], [],
                           model=MODEL)
        for _ in range(200):  # the reader's index follows the feed by itself
            if "memory:k8s" in reader.vectors.index:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the other store's vector never reached this index")
        hits = await reader.recall(QueryRequest(query="kubernetess autoscalerr"))
        assert hits.memories[0].id == "memory:k8s"
        await writer.tokens.revoke("shared")
        with pytest.raises(Exception, match="unknown token"):
            await reader.tokens.authenticate(f"Bearer {raw}", "read")
    finally:
        await writer.close()
        await reader.close()


def test_store_files_are_checked_and_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "dsn"
    path.write_text("# comment\npostgresql://hub@db/hub\n")
    path.chmod(0o600)
    assert read_store_file(path) == "postgresql://hub@db/hub"
    assert resolve_dsn("sqlite", None) is None
    path.chmod(0o644)
    with pytest.raises(ValueError, match=r"^store_file: .* readable by others"):
        read_store_file(path)
    path.chmod(0o600)
    for text in ("", "mysql://x\n", "postgresql://a\npostgresql://b\n"):
        path.write_text(text)
        with pytest.raises(ValueError, match=r"^store_file: "):
            read_store_file(path)
    with pytest.raises(ValueError, match=r"^store_file: .* does not exist"):
        read_store_file(tmp_path / "absent")
    with pytest.raises(ValueError, match=r"^store: "):
        resolve_dsn("mysql://root:secret@db/x", None)
    with pytest.raises(ValueError, match=r"^store: "):
        resolve_dsn("postgresql://db/x", path)


async def test_an_unreachable_database_is_503_with_retry_after(pg_server: PgServer) -> None:
    own = await asyncio.to_thread(PgServer.start)
    try:
        dsn = await asyncio.to_thread(own.create_database, "gone")
        store = await open_store(dsn)
        raw = await store.tokens.create(role="read", name="r")
        runner = web.AppRunner(create_hub_app(store))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            await asyncio.to_thread(own.stop)
            async with aiohttp.ClientSession() as http, http.get(
                    f"{url}/v1/agent/memory/changes",
                    headers={"Authorization": f"Bearer {raw}"}) as resp:
                body = await resp.json()
            assert resp.status == 503, body
            assert resp.headers["Retry-After"] == "5"
            assert body["error"]["code"] == "store_unavailable"
        finally:
            await runner.cleanup()
            await store.close()
        with pytest.raises(StoreUnavailableError):
            await open_store(dsn)
    finally:
        await asyncio.to_thread(own.stop)


async def test_a_hub_restored_from_pg_dump_is_repaired_by_the_laptops(
        pg_server: PgServer, tmp_path: Path) -> None:
    """Back up, write more, restore the backup into a new database: the laptop's cursor is
    not a mark of the restored feed, so it resyncs and pushes back what the hub lost."""
    source = await asyncio.to_thread(pg_server.create_database, "before_restore")
    store = await open_store(source)
    token = await store.tokens.create(role="write", name="laptop")
    runner = web.AppRunner(create_hub_app(store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}"
    lap = await start_laptop("a", tmp_path / "a", url, token)
    dump = tmp_path / "hub.dump"
    try:
        kept = [(await lap.store.memories.save({"content": f"before the backup {i}"}))["node_id"]
                for i in range(3)]
        assert (await lap.sync()).ok
        await asyncio.to_thread(_pg_tool, pg_server, "pg_dump", "--format=custom",
                                f"--file={dump}", source)
        lost = [(await lap.store.memories.save({"content": f"after the backup {i}"}))["node_id"]
                for i in range(2)]
        assert (await lap.sync()).ok
        await runner.cleanup()
        await store.close()

        restored = await asyncio.to_thread(pg_server.create_database, "restored")
        await asyncio.to_thread(_pg_tool, pg_server, "pg_restore", f"--dbname={restored}",
                                str(dump))
        store = await open_store(restored)
        runner = web.AppRunner(create_hub_app(store))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        nodes, _ = await store.export()
        assert {n.id for n in nodes} == set(kept)  # the backup's content, tokens included
        report = await lap.sync()
        assert report.ok, report.error
        assert report.reset == "until went backwards", report
        nodes, _ = await store.export()
        assert {n.id for n in nodes} == set(kept) | set(lost)
        assert set(await live_contents(lap.store)) == set(kept) | set(lost)
        after = await store.apply([node("memory:new", "written after the restore", 99)], [],
                                  model=MODEL)
        assert after.applied_nodes == 1
        report = await lap.sync()
        assert report.ok and report.pulled_nodes == 1, report
    finally:
        await lap.close()
        await runner.cleanup()
        await store.close()


def _pg_tool(server: PgServer, tool: str, *args: str) -> None:
    proc = subprocess.run([str(server.bindir / tool), *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
    assert proc.returncode == 0, proc.stderr


class _FollowAttempts(logging.Handler):
    """The follower's failed catch-ups as it logs them (one debug record per follow period,
    a warning besides for the outage); ``reached`` is set at the ``n``-th failed period."""

    def __init__(self, n: int) -> None:
        super().__init__(logging.DEBUG)
        self.n, self.records = n, list[logging.LogRecord]()
        self.reached = asyncio.Event()  # set from the follower, on the loop's own thread

    def emit(self, record: logging.LogRecord) -> None:
        if "catch-up failed" not in record.getMessage():
            return
        self.records.append(record)
        if sum(r.levelno == logging.DEBUG for r in self.records) >= self.n:
            self.reached.set()


FOLLOW_PERIODS = 30  # failed follow periods to sit through: well past the shutdown's errors


async def test_a_database_gone_away_is_logged_once_not_every_follow_period(
        pg_server: PgServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The index follower retried every half second, each failure a WARNING with a ~60-line
    traceback: thousands of lines a minute while the database was down. Then it warned once
    per distinct error, and a stopping server fails several ways in turn (shutting down,
    reset, refused): one outage gave one to four warnings, depending on timing."""
    monkeypatch.setattr(pg_follow_module, "FOLLOW_SECS", 0.01)
    monkeypatch.setattr(pg_follow_module, "FOLLOW_BACKOFF_CAP_SECS", 0.05)
    attempts, logger = _FollowAttempts(FOLLOW_PERIODS), logging.getLogger("syncd.hub.pg")
    logger.addHandler(attempts)
    own = await asyncio.to_thread(PgServer.start)
    try:
        store = await open_store(await asyncio.to_thread(own.create_database, "gone"))
        try:
            with caplog.at_level(logging.DEBUG, logger="syncd"):
                await asyncio.to_thread(own.stop)
                await attempts.reached.wait()  # it kept trying, a debug record each period...
        finally:
            await store.close()  # the follower is stopped: no record comes after this
        warnings = [r for r in attempts.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]  # ...said it once
        assert warnings[0].exc_info is None  # no traceback at WARNING
        assert all(r.exc_info for r in attempts.records if r.levelno == logging.DEBUG)
    finally:
        logger.removeHandler(attempts)
        await asyncio.to_thread(own.stop)
