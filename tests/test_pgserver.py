"""The throwaway PostgreSQL server (tests/pgserver.py) and its fixtures."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import asyncpg
import pytest

import tests.pgserver as pgserver
from tests.pgserver import PgServer, PgServerError


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _fetchval(dsn: str, sql: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_find_bindir_prefers_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SYNCD_PG_BINDIR", str(tmp_path))
    assert pgserver.find_bindir() == tmp_path


async def test_server_is_up_and_fast(pg_server: PgServer) -> None:
    assert pg_server.running and _accepts(pg_server.port)
    assert pg_server.dsn() == f"postgresql://syncd@127.0.0.1:{pg_server.port}/postgres"
    assert (pg_server.bindir / "postgres").exists()
    conn = await asyncpg.connect(pg_server.dsn())
    try:
        assert await conn.fetchval("SELECT current_setting('server_version_num')::int") >= 130000
        assert await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert await conn.fetchval("SHOW fsync") == "off"
        assert await conn.fetchval("SHOW max_connections") == "200"
        assert await conn.fetchval("SHOW server_encoding") == "UTF8"
    finally:
        await conn.close()


async def test_pg_dsn_accepts_a_connection(pg_dsn: str) -> None:
    assert await _fetchval(pg_dsn, "SELECT 1") == 1
    assert await _fetchval(pg_dsn, "SELECT current_database()") == pg_dsn.rsplit("/", 1)[1]


@pytest.mark.parametrize("run", [1, 2])
async def test_each_test_gets_a_fresh_database(pg_dsn: str, run: int) -> None:
    # Run twice: the second CREATE TABLE would fail if the database were shared.
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        await conn.execute("CREATE TABLE marker (run int)")
        await conn.execute("INSERT INTO marker VALUES ($1)", run)
    finally:
        await conn.close()


async def test_databases_are_distinct(pg_server: PgServer, pg_dsn: str) -> None:
    # create_database is sync but safe to call from inside the running loop.
    other_name = f"other_{uuid.uuid4().hex[:8]}"
    other = pg_server.create_database(other_name)
    try:
        assert other != pg_dsn
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("CREATE TABLE only_here (x int)")
        finally:
            await conn.close()
        assert await _fetchval(other, "SELECT to_regclass('only_here') IS NULL") is True
        assert await _fetchval(pg_dsn, "SELECT to_regclass('only_here') IS NULL") is False
    finally:
        pg_server.drop_database(other_name)


async def test_drop_database_terminates_open_connections(pg_server: PgServer) -> None:
    name = f"doomed_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_server.create_database(name))
    try:
        pg_server.drop_database(name)
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
    with pytest.raises(PgServerError, match="does not exist"):
        pg_server.psql("SELECT 1", database=name)


def test_bad_database_name_is_refused(pg_server: PgServer) -> None:
    with pytest.raises(ValueError, match="database name"):
        pg_server.create_database('x"; DROP DATABASE postgres; --')


def test_stop_really_stops(pg_server: PgServer) -> None:
    server = PgServer.start(bindir=pg_server.bindir)  # its own server: pg_server only for skip/fail
    port, root, pid = server.port, server.root, server.pid
    assert pid is not None and _accepts(port)
    server.stop()
    assert not server.running
    assert not _accepts(port)
    assert not root.exists()
    assert not Path(f"/proc/{pid}").exists()
    server.stop()  # idempotent
    with pytest.raises(PgServerError, match="not running"):
        server.psql("SELECT 1")


def test_start_retries_when_the_port_is_taken(
    pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = pgserver._free_port
        ports = iter([taken])
        monkeypatch.setattr(pgserver, "_free_port", lambda: next(ports, None) or real())
        with PgServer.start(bindir=pg_server.bindir) as server:
            assert server.port != taken
            assert _accepts(server.port)
        assert not server.running
