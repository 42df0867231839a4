"""The hub's long-poll on ``changes`` (``syncd/hub/longpoll.py``, docs/long-poll.md), on SQLite
and PostgreSQL: a held poll answers with the row that commits, empty at its wait, 503 past the
cap, and never in origin mode. Real hubs on port 0, real HTTP; every wait is on state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.config import HubConfig
from syncd.hub.app import HELD_POLLS, create_hub_app
from syncd.hub.longpoll import HEADER
from syncd.hub.store import HubStore, SqliteHubStore
from tests.hub.test_conformance import MODEL, node

CHANGES = "/v1/agent/memory/changes"
OUTER_SECS = 20.0  # generous: a poll that works answers in milliseconds


class Served:
    def __init__(self, runner: web.AppRunner, url: str, token: str) -> None:
        self.runner, self.url, self.token = runner, url, token
        self.app = runner.app

    async def get(self, session: aiohttp.ClientSession, path: str,
                  **params: str) -> tuple[int, dict[str, str], Any]:
        async with session.get(self.url + path, params=params, headers={
                "Authorization": f"Bearer {self.token}"}) as resp:
            return resp.status, dict(resp.headers), await resp.json()


@contextlib.asynccontextmanager
async def serving(hub: HubStore, **options: Any) -> AsyncIterator[Served]:
    token = await hub.tokens.create(role="read", name="laptops")
    runner = web.AppRunner(create_hub_app(hub, config=HubConfig(**options)), shutdown_timeout=60)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Served(runner, f"http://127.0.0.1:{runner.addresses[0][1]}", token)
    finally:
        await runner.cleanup()


async def until_true(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + OUTER_SECS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {OUTER_SECS} s: {what}")
        await asyncio.sleep(0.01)


async def cursor_after_one_row(hub: HubStore) -> str:
    await hub.apply([node("m-first", "the first memory")], [], model=MODEL)
    _, _, until, more = await hub.feed(None)
    assert not more
    return until


async def test_a_held_poll_answers_with_the_row_that_commits(hub_store: HubStore) -> None:
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store) as served, aiohttp.ClientSession() as session:
        poll = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
        polls = served.app[HELD_POLLS]
        await until_true(lambda: polls.held == 1, "the poll is held")
        await hub_store.apply([node("m-live", "committed while the poll waited", 2)], [],
                              model=MODEL)
        status, headers, body = await asyncio.wait_for(poll, OUTER_SECS)
    assert status == 200, body
    assert [n["id"] for n in body["memory_nodes"]] == ["m-live"]
    assert body["until"] != since and body["feed"] == "ingest"
    assert headers[HEADER] == "30"
    assert polls.held == 0


async def test_rows_already_there_are_answered_without_holding(hub_store: HubStore) -> None:
    async with serving(hub_store) as served, aiohttp.ClientSession() as session:
        await hub_store.apply([node("m-there", "already committed")], [], model=MODEL)
        status, _, body = await asyncio.wait_for(
            served.get(session, CHANGES, since="", wait="30"), OUTER_SECS)
    assert status == 200 and [n["id"] for n in body["memory_nodes"]] == ["m-there"]
    assert served.app[HELD_POLLS].held == 0


async def test_a_poll_with_nothing_new_answers_empty_when_its_wait_ends(
        hub_store: HubStore) -> None:
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store) as served, aiohttp.ClientSession() as session:
        began = time.monotonic()
        status, _, body = await asyncio.wait_for(
            served.get(session, CHANGES, since=since, wait="1"), OUTER_SECS)
        held_for = time.monotonic() - began
    assert status == 200, body
    assert body["memory_nodes"] == [] and body["memory_edges"] == []
    assert body["until"] == since and body["has_more"] is False
    assert held_for >= 0.9  # it was held (a lower bound: a busy machine only adds to it)
    assert served.app[HELD_POLLS].held == 0


async def test_the_callers_own_versions_do_not_answer_its_poll(hub_store: HubStore) -> None:
    """``exclude_origin``: laptop A's push wakes A's poll, which reads the feed again, finds
    nothing for A and keeps waiting; B's row then answers it."""
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store) as served, aiohttp.ClientSession() as session:
        poll = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30",
                                                exclude_origin="laptop-a"))
        polls = served.app[HELD_POLLS]
        await until_true(lambda: polls.held == 1, "the poll is held")
        seen = hub_store.commits.generation
        await hub_store.apply([node("m-own", "A's own push", 2, origin="laptop-a")], [],
                              model=MODEL)
        assert hub_store.commits.generation > seen
        await asyncio.sleep(0)  # let the woken poll read the feed before B commits
        await hub_store.apply([node("m-other", "B's push", 3, origin="laptop-b")], [],
                              model=MODEL)
        status, _, body = await asyncio.wait_for(poll, OUTER_SECS)
    assert status == 200, body
    assert [n["id"] for n in body["memory_nodes"]] == ["m-other"]


async def test_past_the_cap_a_poll_is_refused_with_retry_after(hub_store: HubStore) -> None:
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store, max_held_polls=1) as served, \
            aiohttp.ClientSession() as session:
        first = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
        polls = served.app[HELD_POLLS]
        await until_true(lambda: polls.held == 1, "the first poll is held")
        status, headers, body = await asyncio.wait_for(
            served.get(session, CHANGES, since=since, wait="30"), OUTER_SECS)
        assert status == 503, body
        assert body["error"]["code"] == "too_many_polls"
        assert int(headers["Retry-After"]) > 0
        status, _, _ = await served.get(session, CHANGES, since=since)  # no wait: served
        assert status == 200
        _, _, hub_status = await served.get(session, "/v1/agent/status")
        assert hub_status["long_poll"] == {"max_wait_secs": 30.0, "held": 1, "max_held": 1,
                                           "refused": 1}
        await hub_store.apply([node("m-live", "wakes the first", 2)], [], model=MODEL)
        status, _, body = await asyncio.wait_for(first, OUTER_SECS)
    assert status == 200 and [n["id"] for n in body["memory_nodes"]] == ["m-live"]


async def test_a_cap_of_zero_turns_the_long_poll_off(hub_store: HubStore) -> None:
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store, max_held_polls=0) as served, \
            aiohttp.ClientSession() as session:
        status, headers, body = await asyncio.wait_for(
            served.get(session, CHANGES, since=since, wait="30"), OUTER_SECS)
        _, _, hub_status = await served.get(session, "/v1/agent/status")
    assert status == 200 and body["memory_nodes"] == []
    assert HEADER not in headers and hub_status["long_poll"] is None


@pytest.mark.parametrize("wait", ["soon", "-1", "nan", "inf"])
async def test_a_bad_wait_names_the_field(hub_store: HubStore, wait: str) -> None:
    async with serving(hub_store) as served, aiohttp.ClientSession() as session:
        status, _, body = await served.get(session, CHANGES, since="", wait=wait)
    assert status == 422 and body["error"]["field"] == "wait", body


async def test_a_stopping_hub_answers_its_held_polls_at_once(hub_store: HubStore) -> None:
    """Shutdown does not wait out a poll (the runner's shutdown_timeout here is 60 s, the
    poll's wait 30 s: a 200 within the outer timeout is the release)."""
    since = await cursor_after_one_row(hub_store)
    async with contextlib.AsyncExitStack() as stack:
        served = await stack.enter_async_context(serving(hub_store))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        poll = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
        await until_true(lambda: served.app[HELD_POLLS].held == 1, "the poll is held")
        await asyncio.wait_for(served.runner.cleanup(), OUTER_SECS)
        status, _, body = await asyncio.wait_for(poll, OUTER_SECS)
    assert status == 200 and body["memory_nodes"] == []


async def test_an_origin_mode_hub_neither_offers_nor_holds(tmp_path: Path) -> None:
    """Its overlap window re-serves recent rows, so a poll would answer at once every time:
    it ignores ``wait`` (as Kyma ignores unknown parameters) and sends no advertisement."""
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
    hub = SqliteHubStore(store)
    try:
        async with serving(hub, cursor="origin") as served, aiohttp.ClientSession() as session:
            status, headers, body = await asyncio.wait_for(
                served.get(session, CHANGES, since="2030-01-01T00:00:00Z", wait="30"),
                OUTER_SECS)
            _, _, hub_status = await served.get(session, "/v1/agent/status")
        assert status == 200 and body["memory_nodes"] == []
        assert HEADER not in headers and hub_status["long_poll"] is None
        assert served.app[HELD_POLLS].held == 0
    finally:
        await hub.close()


async def test_a_commit_in_another_postgresql_hub_process_answers_the_poll(
        pg_dsn: str) -> None:
    """Two hub processes on one database (two stores, two pools): a poll held by one is
    answered by an import the other commits — LISTEN/NOTIFY, not a timer."""
    from syncd.hub.pg import PgHubStore
    one = await PgHubStore.open(pg_dsn, embedder=HashingEmbedder())
    two = await PgHubStore.open(pg_dsn, embedder=HashingEmbedder())
    try:
        since = await cursor_after_one_row(one)
        async with serving(one) as served, aiohttp.ClientSession() as session:
            woken = one.commits.generation
            await two.apply([node("m-warm", "before the poll", 2)], [], model=MODEL)
            await until_true(lambda: one.commits.generation > woken, "one hears two's commit")
            since = (await one.feed(since))[2]
            poll = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
            await until_true(lambda: served.app[HELD_POLLS].held == 1, "the poll is held")
            await two.apply([node("m-other-process", "committed by process two", 3)], [],
                            model=MODEL)
            status, _, body = await asyncio.wait_for(poll, OUTER_SECS)
        assert status == 200, body
        assert [n["id"] for n in body["memory_nodes"]] == ["m-other-process"]
    finally:
        await two.close()
        await one.close()


async def test_a_poll_its_client_gave_up_stops_counting_against_the_cap(
        hub_store: HubStore) -> None:
    """aiohttp does not cancel a handler whose client left: the held poll notices it (its
    once-a-second look) and leaves the count long before its 30 s wait ends."""
    since = await cursor_after_one_row(hub_store)
    async with serving(hub_store, max_held_polls=1) as served, \
            aiohttp.ClientSession() as session:
        polls = served.app[HELD_POLLS]
        poll = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
        await until_true(lambda: polls.held == 1, "the poll is held")
        poll.cancel()  # the laptop's pass pre-empts its poll: the connection closes
        await asyncio.gather(poll, return_exceptions=True)
        await until_true(lambda: polls.held == 0, "the abandoned poll is let go")
        again = asyncio.ensure_future(served.get(session, CHANGES, since=since, wait="30"))
        await until_true(lambda: polls.held == 1, "a new poll fits under the cap")
        await hub_store.apply([node("m-live", "answers the new poll", 2)], [], model=MODEL)
        status, _, body = await asyncio.wait_for(again, OUTER_SECS)
    assert status == 200 and [n["id"] for n in body["memory_nodes"]] == ["m-live"]
