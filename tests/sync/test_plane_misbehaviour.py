"""The sync client against a plane that answers in surprising ways: each answer here used to
wedge sync, crash a pass, or lose data. Each test drives a real ``SyncEngine`` + ``Store``
(``tests.sync.harness.start_laptop``) against a small scriptable aiohttp plane on a loopback
port.

What each test guards:
  * ``changes`` with ``has_more`` and an ``until`` that does not advance ends the pass with an
    error after applying the page, instead of asking for the same page forever.
  * An ``until`` that is no timestamp (empty, or garbage) is not stored as the cursor.
  * ``export`` with ``has_more`` and a ``next_cursor`` already walked ends the pass with an
    error, instead of walking the same page forever.
  * One ``changes`` row of a wrong type (a ``null`` in its embedding is how the plane writes a
    NaN) costs only itself (R5): the rest of the page applies, the push still runs, and the row
    is skipped after ``BAD_ROW_PASSES`` and reported.
  * The same row in an ``export`` page costs only itself too: named once in status, and the
    laptop's own copy of that id is not pushed over it.
  * A ``Date`` header in year 9999 is refused as a clock offset and reported; local writes keep
    working, also after a restart over such an offset stored by an earlier version.
  * ``syncd status`` stops naming a refused clock reading once the plane answers sanely, and
    a laptop clock years off is still corrected by a sane plane (over http:// too).
  * A ``Retry-After`` too large for a float is honoured as the backoff cap, not ignored.
  * A row the plane refuses first in the outbox does not hold back the rows after it.
  * An import answer with a row error that names no row of the batch acknowledges nothing:
    the plane refused something, and the client cannot tell what."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from protocol.rows import NodeRow
from syncd.sync.pull import BAD_ROW_PASSES
from syncd.sync.status import BACKOFF_CAP_SECS
from tests.conftest import serving_app
from tests.sync.harness import start_laptop

UNTIL = "2026-01-01T00:00:00+00:00"
PASS_LIMIT_SECS = 10  # a pass that loops on the plane's paging never ends: fail, not hang
YEAR_NS = 365 * 86_400 * 10**9


def node(i: int, ts: str = "2025-06-01T00:00:00+00:00", **extra: Any) -> dict[str, Any]:
    """A node row as the plane's ``changes`` serialises it (NULL columns omitted)."""
    row: dict[str, Any] = {
        "id": f"memory:00000000-0000-4000-8000-{i:012d}", "labels": "Memory",
        "realm": "default", "memory_type": "fact", "content": f"plane row {i}",
        "content_preview": f"plane row {i}", "tags": "", "importance": 0.5,
        "status": "active", "embedding": [0.0] * 384, "created_at": ts, "updated_at": ts,
        "valid_at": ts}
    row.update(extra)
    return row


class Plane:
    """Each route answers with what its handler returns (a dict → JSON, or a Response)."""

    def __init__(self) -> None:
        self.changes: Callable[[web.Request], Any] = lambda r: {
            "since": r.query.get("since", ""), "until": UNTIL,
            "memory_nodes": [], "memory_edges": []}
        self.export: Callable[[web.Request], Any] = lambda r: {
            "memory_nodes": [], "memory_edges": []}
        self.imp: Callable[[web.Request, Any], Any] = lambda r, body: {
            "applied_nodes": len(body["memory_nodes"]),
            "applied_edges": len(body["memory_edges"]), "errors": []}
        self.calls: list[str] = []
        self.imports: list[Any] = []

    def app(self) -> web.Application:
        def route(name: str, fn: Callable[[], Callable[..., Any]],
                  ) -> Callable[[web.Request], Any]:
            async def handler(request: web.Request) -> web.StreamResponse:
                self.calls.append(name)
                args: tuple[Any, ...] = ()
                if name == "import":
                    body = await request.json()
                    self.imports.append(body)
                    args = (body,)
                out = fn()(request, *args)
                return out if isinstance(out, web.StreamResponse) else web.json_response(out)
            return handler
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/agent/memory/changes", route("changes", lambda: self.changes))
        app.router.add_get("/v1/agent/memory/export", route("export", lambda: self.export))
        app.router.add_get("/v1/agent/memory/settings", route("settings", lambda: lambda r: {}))
        app.router.add_post("/v1/agent/memory/import", route("import", lambda: self.imp))
        return app


def serving(plane: Plane) -> contextlib.AbstractAsyncContextManager[str]:
    return serving_app(plane.app())


async def held_ids(store: Any) -> set[str]:
    return {r["id"] for r in (await store.memories.list_memories())["rows"]}


async def test_changes_with_an_until_that_does_not_advance_ends_the_pass(
        tmp_path: Path) -> None:
    """Every page says ``has_more`` with the same ``until``: the pull asked for it again and
    again, holding the single-flight lock forever. The page's rows still apply."""
    row = node(1)
    plane = Plane()
    plane.changes = lambda r: {"since": r.query.get("since", ""), "until": UNTIL,
                               "memory_nodes": [row], "memory_edges": [], "has_more": True}
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            report = await asyncio.wait_for(laptop.sync(), PASS_LIMIT_SECS)
            assert not report.ok
            assert report.error is not None and UNTIL in report.error, report.error
            assert plane.calls.count("changes") == 2  # the second answer shows it is stuck
            assert row["id"] in await held_ids(laptop.store)
            assert laptop.engine.status.last_error == report.error
        finally:
            await laptop.close()


@pytest.mark.parametrize("until", ["", "not a time"], ids=["empty", "garbage"])
async def test_an_until_that_is_no_timestamp_keeps_the_cursor(tmp_path: Path,
                                                               until: str) -> None:
    """The engine stored it as the cursor, and every later pass quietly pulled everything
    again from the start (Kyma's own client keeps its cursor for an empty ``until``). The
    page's rows apply; the cursor stays where it was; with ``has_more`` the pass ends instead
    of asking from the start again and again."""
    first, second = node(1), node(2)
    answer = {"until": UNTIL, "rows": [first], "has_more": False}
    plane = Plane()
    plane.changes = lambda r: {"since": r.query.get("since", ""), "until": answer["until"],
                               "memory_nodes": answer["rows"], "memory_edges": [],
                               "has_more": answer["has_more"]}
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            assert (await laptop.sync()).ok
            answer.update(until=until, rows=[second])
            report = await laptop.sync()
            assert report.cursor_kept == until
            assert (await laptop.store.replication.sync_state())["cursor"] == UNTIL
            assert second["id"] in await held_ids(laptop.store)
            answer["has_more"] = True
            calls = plane.calls.count("changes")
            report = await asyncio.wait_for(laptop.sync(), PASS_LIMIT_SECS)
            assert not report.ok and report.error is not None
            assert "does not advance" in report.error, report.error
            assert plane.calls.count("changes") - calls == 1
            assert (await laptop.store.replication.sync_state())["cursor"] == UNTIL
        finally:
            await laptop.close()


async def test_export_with_a_next_cursor_already_walked_ends_the_pass(tmp_path: Path) -> None:
    """Every export page says ``has_more`` with the same ``next_cursor``: anti-entropy walked
    it about a thousand times a second, forever."""
    plane = Plane()
    plane.export = lambda r: {"memory_nodes": [], "memory_edges": [], "has_more": True,
                              "next_cursor": "page-2"}
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok", anti_entropy_secs=0)
        try:
            report = await asyncio.wait_for(laptop.sync(), PASS_LIMIT_SECS)
            assert not report.ok
            assert report.error is not None and "page-2" in report.error, report.error
            assert plane.calls.count("export") == 2
        finally:
            await laptop.close()


@pytest.mark.parametrize("bad", [{"embedding": [None] * 384}, {"importance": "high"}],
                         ids=["null-in-embedding", "wrong-type"])
async def test_one_row_of_a_wrong_type_does_not_stall_pull_and_push(
        tmp_path: Path, bad: dict[str, Any]) -> None:
    """msgspec refused the whole page for one row (``Expected float, got null``), as a
    transient error: nothing applied and the push never ran, every pass, forever. Now the
    row holds the cursor like a row the store refuses, and is skipped after
    ``BAD_ROW_PASSES`` passes (R5)."""
    good, poisoned = node(1), node(2, **bad)
    body = json.dumps({"since": "", "until": UNTIL, "memory_nodes": [good, poisoned],
                       "memory_edges": []})
    plane = Plane()
    plane.changes = lambda r: web.Response(text=body, content_type="application/json")
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            await laptop.store.memories.save({"content": "written on the laptop"})
            first = await laptop.sync()
            assert first.pull_stopped and first.pull_problems, first.error
            assert good["id"] in await held_ids(laptop.store)
            assert plane.imports, "the local edit was never pushed"
            assert (await laptop.store.replication.sync_state()).get("cursor") is None  # held
            for _ in range(BAD_ROW_PASSES - 1):
                await laptop.sync()
            assert (await laptop.store.replication.sync_state()).get("cursor") == UNTIL
            skipped = laptop.engine.status.skipped_rows
            assert len(skipped) == 1 and poisoned["id"] in skipped[0], skipped
            assert poisoned["id"] not in await held_ids(laptop.store)
            assert await laptop.store.replication.outbox_depth() == 0
            assert (await laptop.sync()).ok
        finally:
            await laptop.close()


async def test_an_export_row_of_a_wrong_type_costs_only_itself(tmp_path: Path) -> None:
    """The same row in the plane's export failed all of anti-entropy, every pass it was due
    (and a restored store runs it before its first push). Now the rest applies, the row is
    named once in status, and the laptop's own copy of that id is not pushed over a version
    nobody here could read."""
    good, poisoned = node(1), node(2, embedding=[None] * 384)
    body = json.dumps({"memory_nodes": [good, poisoned], "memory_edges": []})
    plane = Plane()
    plane.export = lambda r: web.Response(text=body, content_type="application/json")
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok", anti_entropy_secs=0)
        try:
            mine = node(2, ts="2025-01-01T00:00:00+00:00", content="the laptop's older copy")
            await laptop.store.replication.apply([msgspec.convert(mine, NodeRow)], [], model="m")
            for _ in range(2):
                report = await asyncio.wait_for(laptop.sync(), PASS_LIMIT_SECS)
                assert report.ok and report.anti_entropy, report.error
            assert good["id"] in await held_ids(laptop.store)
            skipped = laptop.engine.status.skipped_rows
            assert len(skipped) == 1 and poisoned["id"] in skipped[0], skipped
            pushed = [n["id"] for body in plane.imports for n in body["memory_nodes"]]
            assert poisoned["id"] not in pushed, pushed
        finally:
            await laptop.close()


async def test_a_date_header_in_year_9999_is_refused_and_local_writes_keep_working(
        tmp_path: Path) -> None:
    """The engine stored an ~8000-year clock offset from such a header: the pass raised
    ``TimestampError`` (a traceback, not a reported error) and every later local save failed,
    also after a restart, which restored the offset."""
    plane = Plane()
    plane.changes = lambda r: web.json_response(
        {"since": "", "until": UNTIL, "memory_nodes": [], "memory_edges": []},
        headers={"Date": "Fri, 31 Dec 9999 23:59:59 GMT"})
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            report = await laptop.sync()
            assert report.ok, report.error
            assert report.clock_refused is not None
            assert laptop.engine.status.clock_offset_refused == report.clock_refused
            assert laptop.store.clock.offset_ns == 0
            assert laptop.engine.status.clock_offset_ms == 0
            saved = await laptop.store.memories.save({"content": "a note after the pass"})
            assert (await laptop.store.memories.get(saved["node_id"]))["updated_at"] < "2200"
            # as an earlier version left it: the absurd offset stored, restored at start
            await laptop.store.replication.set_sync_state({"clock_offset_ns": str(8000 * YEAR_NS)})
        finally:
            await laptop.close()
        again = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            assert again.store.clock.offset_ns == 0
            assert again.engine.status.clock_offset_refused is not None
            saved = await again.store.memories.save({"content": "a note after the restart"})
            assert (await again.store.memories.get(saved["node_id"]))["updated_at"] < "2200"
            assert (await again.store.replication.sync_state())["clock_offset_ns"] == "0"
        finally:
            await again.close()


async def test_a_refused_date_is_no_longer_reported_once_the_plane_answers_sanely(
        tmp_path: Path) -> None:
    """``status.clock_offset_refused`` is set on one absurd ``Date`` and never cleared: after
    the plane's clock is fine again, ``syncd status`` keeps printing "clock_refused … offset
    not applied" until the daemon restarts (and after a restart over an old stored offset,
    for ever)."""
    plane = Plane()
    date = {"value": "Fri, 31 Dec 9999 23:59:59 GMT"}
    plane.changes = lambda r: web.json_response(
        {"since": "", "until": UNTIL, "memory_nodes": [], "memory_edges": []},
        headers={"Date": date["value"]})
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            assert (await laptop.sync()).clock_refused is not None
            date["value"] = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime())
            report = await laptop.sync()
            assert report.ok and report.clock_refused is None
            assert laptop.engine.status.clock_offset_refused is None
        finally:
            await laptop.close()


async def test_a_clock_years_behind_is_still_corrected_by_an_http_hub(tmp_path: Path) -> None:
    """A first bound on the offset's size (400 days, "too far off to reach a plane over
    TLS") also refused a real clock that far off — over http:// (a hub on the LAN) it can
    reach one: a machine whose RTC reset kept its wrong clock and pushed every edit with a
    stamp years old. The bound is on the plane's clock instead."""
    behind = 2 * YEAR_NS
    plane = Plane()
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok",
                                    wall=lambda: time.time_ns() - behind)
        try:
            report = await laptop.sync()
            assert report.clock_refused is None, report.clock_refused
            assert abs(laptop.store.clock.offset_ns - behind) < 10 * 10**9
        finally:
            await laptop.close()


async def test_a_retry_after_too_large_for_a_float_is_capped_not_ignored(
        tmp_path: Path) -> None:
    """``Retry-After`` is ``1*DIGIT`` (RFC 9110): 400 digits parse to ``inf``, which the engine
    skipped, retrying after ~1 s a plane that asked for the longest pause."""
    plane = Plane()
    plane.changes = lambda r: web.Response(status=429, text="slow down",
                                           headers={"Retry-After": "9" * 400})
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            report = await laptop.sync()
            assert report.error_kind == "transient"
            assert laptop.engine.status.next_attempt_in_secs == BACKOFF_CAP_SECS
        finally:
            await laptop.close()


@pytest.mark.parametrize(("errors", "row_error"), [
    (["nodes[5].embedding: bad"], {"kind": "node", "index": 5}),
    ([], {"kind": "node", "index": 5}),
    (["widgets[0]: bad"], {"kind": "widget", "index": 0}),
], ids=["index-out-of-range", "no-errors", "unknown-kind"])
async def test_import_row_errors_that_match_no_row_keep_every_entry(
        tmp_path: Path, errors: list[str], row_error: dict[str, Any]) -> None:
    """Only the entries whose (kind, index) matched a row error were kept: one matching no
    row acknowledged every entry, so data the plane refused left the outbox for good."""
    plane = Plane()
    plane.imp = lambda r, body: {
        "applied_nodes": 0, "applied_edges": 0, "errors": errors,
        "row_errors": [{**row_error, "field": "embedding", "message": "bad"}]}
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok")
        try:
            await laptop.store.memories.save({"content": "must not be lost"})
            report = await laptop.sync()
            assert await laptop.store.replication.outbox_depth() == 1, "a refused push was acknowledged"
            assert not report.ok
            assert report.error is not None and "nothing acknowledged" in report.error
        finally:
            await laptop.close()


def test_syncd_status_names_a_refused_clock_offset() -> None:
    from syncd.report import _sync_lines
    why = "the plane's Date header puts this clock +2,914,000 days off the plane's"
    lines = _sync_lines({"configured": True, "url": "http://plane", "interval_secs": 30,
                         "clock_offset_refused": why})
    assert f"    {'clock_refused':20} {why}" in lines
    assert not any("clock_refused" in line for line in _sync_lines(
        {"configured": True, "url": "http://plane", "interval_secs": 30}))


async def test_a_row_refused_first_in_the_outbox_does_not_hold_back_the_rest(
        tmp_path: Path) -> None:
    """A row error ended the pass at the batch that held it: with more than one batch queued,
    a row the plane keeps refusing (NUL text to a PostgreSQL hub, a wrong-width vector to
    Kyma) first in the outbox held every later row back, pass after pass, and each failed
    pass doubled the backoff. Now the refused row stays queued, everything else is pushed,
    and the pass is ``held_back`` without a backoff."""
    refused_content = "the plane refuses this one"

    def answer(request: web.Request, body: Any) -> dict[str, Any]:
        bad = [i for i, n in enumerate(body["memory_nodes"]) if n["content"] == refused_content]
        return {"applied_nodes": len(body["memory_nodes"]) - len(bad),
                "applied_edges": len(body["memory_edges"]),
                "errors": [f"memory_nodes[{i}].content: refused" for i in bad],
                "row_errors": [{"kind": "node", "index": i, "message": "refused"} for i in bad]}

    plane = Plane()
    plane.imp = answer
    async with serving(plane) as url:
        laptop = await start_laptop("a", tmp_path / "a", url, "tok", push_batch_bytes=4000)
        try:
            await laptop.store.memories.save({"content": refused_content})
            for i in range(12):
                await laptop.store.memories.save({"content": f"a note the plane takes {i}"})
            report = await laptop.sync()
            assert not report.ok and report.error_kind == "held_back", report.error
            assert len(plane.imports) > 1  # more than one batch
            assert report.pushed_nodes == 12 and report.push_refused, report
            assert await laptop.store.replication.outbox_depth() == 1
            assert laptop.engine.status.next_attempt_in_secs == 0  # no backoff
            assert "refused 1 queued rows" in (report.error or ""), report.error
            sent = len(plane.imports)
            again = await laptop.sync()  # tried again, once
            assert again.push_refused == report.push_refused
            assert len(plane.imports) == sent + 1
        finally:
            await laptop.close()
