"""The laptop's use of a hub's long-poll (``SyncRunner``, ``SyncEngine.watch``,
docs/long-poll.md): a save on A is pushed at once and reaches B through B's held poll with no
interval tick (interval 3600 s); against a Kyma-like plane that offers none, interval polling
alone, and no ``wait`` is ever sent; stopping never waits for a held poll. Real hubs, real
stores, real HTTP; every wait is on state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from local_store import HashingEmbedder, NotFoundError, Store
from syncd.config import HubConfig
from syncd.hub.app import HELD_POLLS, create_hub_app
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import SyncOptions
from syncd.sync.runner import SyncRunner
from tests.sync.harness import MODEL, Hub, start_hub
from tests.sync.test_kyma_plane import KymaLike

OUTER_SECS = 30.0  # generous: through a held poll a save arrives in well under a second


async def until_true(check: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + OUTER_SECS
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {OUTER_SECS} s: {what}")
        await asyncio.sleep(0.01)


async def holds(store: Store, memory_id: str) -> bool:
    try:
        await store.memories.get(memory_id)
    except NotFoundError:
        return False
    return True


class Laptops:
    def __init__(self) -> None:
        self.stores: list[Store] = []
        self.runners: list[SyncRunner] = []
        self.passes: dict[str, list[str]] = {}

    async def start(self, name: str, data_dir: Path, url: str, token: str, *,
                    interval: float) -> tuple[Store, SyncRunner]:
        store = await Store.open(data_dir, embedder=HashingEmbedder())
        runner = SyncRunner.create(store, url=url, token=token,
                                   options=SyncOptions(plane_model=MODEL), interval=interval,
                                   jitter=0, timeout=5.0)
        triggers = self.passes.setdefault(name, [])
        run_pass = runner.engine.run_pass

        async def recorded(trigger: str = "manual") -> Any:  # which passes ran, and why
            triggers.append(trigger)
            return await run_pass(trigger)

        runner.engine.run_pass = recorded  # type: ignore[method-assign]
        self.stores.append(store)
        self.runners.append(runner)
        await runner.start()
        return store, runner

    async def close(self) -> None:
        """Stop every laptop (again: nothing happens)."""
        runners, stores, self.runners, self.stores = self.runners, self.stores, [], []
        for runner in runners:
            await runner.stop()
        for store in stores:
            await store.close()


@pytest.fixture
async def laptops() -> AsyncIterator[Laptops]:
    held = Laptops()
    try:
        yield held
    finally:
        await held.close()


@pytest.fixture
async def hub(tmp_path: Path, laptops: Laptops) -> AsyncIterator[Hub]:
    """An ingest-mode hub, closed after the laptops (``laptops`` is set up first)."""
    started = await start_hub(tmp_path / "hub", "ingest")
    yield started
    await laptops.close()
    await started.close()


async def test_a_save_on_a_reaches_b_through_the_long_poll_without_a_tick(
        tmp_path: Path, hub: Hub, laptops: Laptops) -> None:
    store_a, runner_a = await laptops.start("a", tmp_path / "a", hub.url, hub.token,
                                            interval=3600)
    store_b, runner_b = await laptops.start("b", tmp_path / "b", hub.url, hub.token,
                                            interval=3600)
    polls = hub.runner.app[HELD_POLLS]

    async def both_held() -> bool:
        return polls.held == 2

    await until_true(both_held, "A and B each hold a poll after their first pass")
    assert (await runner_b.status())["long_poll_held"] is True
    assert (await runner_b.status())["long_poll_secs"] == 25.0
    saved = await store_a.memories.save({"content": "the deploy key moved to the vault on Tuesday"})

    async def on_b() -> bool:
        return await holds(store_b, saved["node_id"])

    await until_true(on_b, "A's save is on B")
    assert laptops.passes["a"][0] == "schedule" and "local" in laptops.passes["a"]
    assert laptops.passes["b"][0] == "schedule" and "live" in laptops.passes["b"]
    assert "schedule" not in laptops.passes["a"][1:] + laptops.passes["b"][1:]  # no tick
    assert (await runner_a.status())["outbox"] == 0

    async def b_polls_again() -> bool:
        return polls.held == 2 and (await runner_b.status())["long_poll_held"]

    await until_true(b_polls_again, "B holds a poll again after its pass")


async def test_a_stopping_laptop_does_not_wait_for_its_held_poll(
        tmp_path: Path, hub: Hub, laptops: Laptops) -> None:
    _, runner = await laptops.start("a", tmp_path / "a", hub.url, hub.token, interval=3600)
    polls = hub.runner.app[HELD_POLLS]

    async def held() -> bool:
        return polls.held == 1

    await until_true(held, "the poll is held")
    await asyncio.wait_for(runner.stop(), 10.0)  # the poll's wait is 25 s
    assert (await runner.status())["long_poll_held"] is False


async def test_a_hub_with_long_poll_off_is_polled_on_the_interval(
        tmp_path: Path, laptops: Laptops) -> None:
    """``[hub] max_held_polls = 0``: no advertisement, so the laptops keep their schedule."""
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
    token = await asyncio.to_thread(create_token, tmp_path / "hub", role="write", name="l")
    book = await asyncio.to_thread(TokenBook, tmp_path / "hub")
    runner = web.AppRunner(create_hub_app(store, book, config=HubConfig(max_held_polls=0)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        store_a, _ = await laptops.start("a", tmp_path / "a", url, token, interval=0.2)
        store_b, runner_b = await laptops.start("b", tmp_path / "b", url, token, interval=0.2)
        saved = await store_a.memories.save({"content": "interval polling still carries this"})

        async def on_b() -> bool:
            return await holds(store_b, saved["node_id"])

        await until_true(on_b, "A's save is on B")
        status = await runner_b.status()
        assert status["long_poll_secs"] is None and status["long_poll_held"] is False
        assert "live" not in laptops.passes["b"]
    finally:
        await laptops.close()
        await runner.cleanup()
        await store.close()


async def test_against_kyma_the_laptop_keeps_interval_polling_and_sends_no_wait(
        tmp_path: Path, laptops: Laptops) -> None:
    plane, asked = KymaLike(), []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/changes"):
            asked.append(dict(request.query))
        return await handler(request)

    app = web.Application(middlewares=[record])
    plane.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        store_a, _ = await laptops.start("a", tmp_path / "a", url, "t", interval=0.2)
        store_b, runner_b = await laptops.start("b", tmp_path / "b", url, "t", interval=0.2)
        saved = await store_a.memories.save({"content": "Kyma has no long-poll; the schedule carries it"})

        async def on_b() -> bool:
            return await holds(store_b, saved["node_id"])

        await until_true(on_b, "A's save is on B through the Kyma-like plane")

        async def ticked() -> bool:
            return laptops.passes["b"].count("schedule") >= 3

        await until_true(ticked, "B keeps its interval schedule")
        status = await runner_b.status()
        assert status["long_poll_secs"] is None and status["long_poll_held"] is False
        assert asked and not any("wait" in query for query in asked)
        assert "live" not in laptops.passes["b"]
    finally:
        await laptops.close()
        await runner.cleanup()


class StuckHub:
    """A small real server that offers the long-poll and, after the first cursor, serves one
    row no store can apply (``updated_at`` is no time), forever: a poisoned feed (R5)."""

    FIRST, LATER = "2026-12-02T10:00:00.000000000Z", "2026-12-02T10:00:01.000000000Z"

    def __init__(self) -> None:
        self.polls = 0

    async def changes(self, request: web.Request) -> web.Response:
        since = request.query.get("since", "")
        self.polls += "wait" in request.query
        rows = [] if not since else [{
            "id": "memory:00000000-0000-4000-8000-00000000000b", "content": "poisoned",
            "realm": "default", "memory_type": "fact", "importance": 0.5, "status": "active",
            "created_at": "not-a-time", "updated_at": "not-a-time", "origin": "elsewhere"}]
        return web.json_response(
            {"since": since, "until": self.LATER if since else self.FIRST, "memory_nodes": rows,
             "memory_edges": [], "store_id": "stuck", "has_more": False, "feed": "ingest"},
            headers={"Syncd-Long-Poll": "30"})

    async def settings(self, request: web.Request) -> web.Response:
        return web.json_response({"default_limit": 8, "embedding_model": MODEL})

    async def export(self, request: web.Request) -> web.Response:
        return web.json_response({"memory_nodes": [], "memory_edges": []})


async def test_a_row_that_holds_the_cursor_does_not_loop_the_long_poll(
        tmp_path: Path, laptops: Laptops) -> None:
    """The poll sees the poisoned row, the "live" pass cannot apply it and the cursor stays:
    no new poll starts until the next tick (3600 s here), so the laptop does not spin."""
    plane = StuckHub()
    app = web.Application()
    app.router.add_get("/v1/agent/memory/changes", plane.changes)
    app.router.add_get("/v1/agent/memory/settings", plane.settings)
    app.router.add_get("/v1/agent/memory/export", plane.export)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        _, sync = await laptops.start("b", tmp_path / "b", f"http://127.0.0.1:"
                                      f"{runner.addresses[0][1]}", "t", interval=3600)
        waits: list[int] = []  # how many passes had run when the loop began each wait
        next_wait = sync._next

        async def recorded(wait: float) -> str:  # called once _watch has decided
            waits.append(len(laptops.passes["b"]))
            return await next_wait(wait)

        sync._next = recorded  # type: ignore[method-assign]

        async def back_to_waiting() -> bool:
            return 2 in waits

        await until_true(back_to_waiting, "the poll saw the row, a live pass ran, the loop "
                                          "waits again")
        assert not (await sync.status())["long_poll_held"]
        report = sync.engine.status.last_pass
        assert report is not None and report["pull_problems"] == 1
        assert (await sync.engine.store.replication.sync_state())["cursor"] == StuckHub.FIRST
        assert plane.polls == 1
        assert laptops.passes["b"] == ["schedule", "live"]
    finally:
        await laptops.close()
        await runner.cleanup()
