"""The daemon's ``/metrics`` read with Prometheus's own text parser: exact values, a ``# HELP``
and ``# TYPE`` for every metric, labels no client can grow, and nothing but one unlabelled
counter for a request the guards refuse. (The hub's page: ``tests/hub/test_hub_metrics.py``.)"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from syncd.http.metrics import (
    KNOWN_METHODS,
    Family,
    Handler,
    Metrics,
    format_value,
    render,
    store_gauges,
)
from tests.conftest import serving_app
from tests.syncd.conftest import TOKEN, Daemon

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# methods llhttp (aiohttp's C parser) reads, so they reach the app, and none of KNOWN_METHODS
EXTENSION_METHODS = ["PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK",
                     "SEARCH", "REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH",
                     "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE", "MKCALENDAR", "LINK",
                     "UNLINK", "SOURCE", "QUERY"]
UNAUTHORIZED = "syncd_http_unauthorized_total"


def unknown_methods(count: int, seed: int = 7) -> list[str]:
    """Random methods outside ``KNOWN_METHODS``: a mix of ones aiohttp's C parser reads (they
    reach the app and are counted) and random tokens (the C parser answers 400 before the app;
    the pure-Python parser passes them on)."""
    rng = random.Random(seed)
    drawn = [rng.choice(EXTENSION_METHODS) if rng.random() < 0.5 else
             "X" + "".join(rng.choices(string.ascii_uppercase, k=8)) for _ in range(count)]
    assert not KNOWN_METHODS & set(drawn)
    return drawn


def parse(text: str) -> dict[str, Series]:
    """Each family's samples by (sample name, sorted labels), read by prometheus_client."""
    families: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no # HELP"
        assert family.type != "unknown", f"{family.name} has no # TYPE"
        families[family.name] = {_key(s): s.value for s in family.samples}
    return families


def _key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
    return sample.name, tuple(sorted(sample.labels.items()))


def every_series(families: dict[str, Series]) -> Series:
    return {key: value for series in families.values() for key, value in series.items()}


def label_values(families: dict[str, Series], label: str) -> set[str]:
    return {dict(labels)[label] for name, labels in every_series(families)
            if label in dict(labels)}


def help_and_type_lines(text: str) -> None:
    """Every sample's metric has a ``# HELP`` and a ``# TYPE`` line before it, in the text
    itself (the parser alone would name an untyped family ``unknown``, not refuse it)."""
    declared: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            kind, name = line.split(" ")[1:3]
            declared.setdefault(name, set()).add(kind)
            continue
        sample = line.split("{")[0].split(" ")[0]
        family = next((n for n in declared if sample in (n, f"{n}_sum", f"{n}_count")), None)
        assert family is not None and declared[family] == {"HELP", "TYPE"}, line


Scrape = Callable[[], Awaitable[tuple[str, dict[str, Series]]]]


def scraper(daemon: Daemon) -> Scrape:
    async def scrape() -> tuple[str, dict[str, Series]]:
        status, text, headers = await daemon.call("GET", "/metrics")
        assert status == 200 and isinstance(text, str), text
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        help_and_type_lines(text)
        return text, parse(text)
    return scrape


def without_scrapes(families: dict[str, Series]) -> Series:
    """Every series but the scrapes' own (``route="/metrics"``) and the unauthorized count."""
    return {key: value for key, value in every_series(families).items()
            if ("route", "/metrics") not in key[1] and key[0] != UNAUTHORIZED}


# ---------------------------------------------------------------------- the pure render path

@pytest.mark.parametrize(("value", "shown"), [
    (123456789, "123456789"),  # `{value:g}` printed 1.23457e+08
    (2**63 - 1, "9223372036854775807"),  # beyond a float's 53 bits: still every digit
    (0, "0"),
    (True, "1"),
    (0.25, "0.25"),
    (1234567.891, "1234567.891"),
    (1e-7, "1e-07"),
    (math.inf, "+Inf"),
    (-math.inf, "-Inf"),
    (math.nan, "NaN"),
])
def test_a_value_is_printed_exactly(value: float, shown: str) -> None:
    assert format_value(value) == shown


async def test_a_large_store_reads_back_exactly_through_the_page() -> None:
    """The page the handler answers with (``Metrics.page`` over ``store_gauges``), read by
    Prometheus's parser: a 123,456,789-byte store is exactly that."""
    response = Metrics().page(store_gauges(
        {"memories": 123456789, "tombstones": 0, "edges": 9876543210, "outbox": 100000001},
        123456789))
    assert isinstance(response.body, bytes)
    text = response.body.decode()
    help_and_type_lines(text)
    found = parse(text)
    assert found["syncd_store_bytes"] == {("syncd_store_bytes", ()): 123456789}
    assert found["syncd_store_memories"] == {("syncd_store_memories", ()): 123456789}
    assert found["syncd_store_edges"] == {("syncd_store_edges", ()): 9876543210}
    assert found["syncd_outbox_depth"] == {("syncd_outbox_depth", ()): 100000001}
    assert "syncd_store_bytes 123456789\n" in text


def test_a_label_value_is_escaped() -> None:
    odd = 'a "quoted" back\\slash\nand a newline'
    text = render([Family("x_total", "counter", "help with a \\ and a\nnewline",
                          [("", {"route": odd}, 1)])])
    (family,) = text_string_to_metric_families(text)
    assert family.documentation == "help with a \\ and a\nnewline"
    assert [s.labels for s in family.samples] == [{"route": odd}]


# ---------------------------------------------------------------------- a real daemon

async def test_the_page_keeps_its_names_and_counts_requests_exactly(daemon: Daemon) -> None:
    scrape = scraper(daemon)
    for _ in range(37):
        assert (await daemon.call("GET", "/v1/agent/memory/items/memory:nope"))[0] == 404
    await daemon.call("POST", "/v1/agent/memory/tools/save_memory", json={"content": "kept"})
    await daemon.store.maintenance.checkpoint()  # the WAL copied in now, so the files keep their sizes
    text, found = await scrape()
    assert set(found) >= {"syncd_http_requests", "syncd_http_request_duration_seconds",
                          "syncd_http_unauthorized", "syncd_store_memories",
                          "syncd_store_edges", "syncd_store_bytes", "syncd_outbox_depth"}
    route = "/v1/agent/memory/items/{id}"  # the route's name: the ids asked for are not labels
    assert found["syncd_http_requests"][("syncd_http_requests_total", (
        ("method", "GET"), ("route", route), ("status", "404")))] == 37
    assert found["syncd_http_request_duration_seconds"][(
        "syncd_http_request_duration_seconds_count", (("route", route),))] == 37
    assert found["syncd_store_memories"] == {("syncd_store_memories", ()): 1}
    stats = await daemon.store.maintenance.stats()
    assert found["syncd_outbox_depth"] == {("syncd_outbox_depth", ()): stats["outbox"]}
    assert found["syncd_store_bytes"] == {
        ("syncd_store_bytes", ()): await daemon.store.maintenance.disk_bytes()}
    assert "memory:nope" not in text


async def test_unknown_methods_and_paths_add_at_most_one_label_value_each(
        daemon: Daemon) -> None:
    scrape = scraper(daemon)
    await scrape()  # so the scrapes' own series are on the page before
    _, before = await scrape()
    methods, statuses = unknown_methods(50), set()
    for method in methods:
        status, _, _ = await daemon.call(method, "/v1/agent/status")
        statuses.add(status)
    for n in range(50):
        status, _, _ = await daemon.call("GET", f"/no/such/{n}/{random.random()}")
        assert status == 404
    assert statuses <= {400, 405}  # 400: the C parser refused it before the app saw it
    _, after = await scrape()
    assert label_values(after, "method") - label_values(before, "method") == {"other"}
    assert label_values(after, "route") - label_values(before, "route") == {"unmatched"}
    reached = sum(m in EXTENSION_METHODS for m in methods)  # others reach it without the C parser
    requests = after["syncd_http_requests"]
    assert sum(v for (_, labels), v in requests.items() if ("method", "other") in labels) >= reached


async def test_a_refused_request_adds_only_the_unauthorized_count(daemon: Daemon) -> None:
    """Whatever a client without the token sends — any method, any path, a wrong token, a
    token in the query, a foreign Host or Origin, a session cookie without its key — the page
    changes in one number, by one per refusal the app answered."""
    scrape = scraper(daemon)
    _, before = await scrape()
    refused = 0
    attempts: list[tuple[str, str, dict[str, str]]] = [
        *((m, f"/v1/agent/memory/items/{n}", {"X": "1"})
          for n, m in enumerate(unknown_methods(50, seed=11))),
        *(("GET", f"/random/{n}", {"Authorization": f"Bearer wrong-{n}"}) for n in range(20)),
        ("GET", f"/v1/agent/status?token={TOKEN}", {"X": "1"}),
        ("GET", "/v1/agent/status", {"Authorization": f"Bearer {TOKEN}", "Host": "evil.test"}),
        ("GET", "/v1/agent/status", {"Authorization": f"Bearer {TOKEN}",
                                     "Origin": "http://evil.test"}),
        ("GET", "/v1/agent/status", {"Cookie": "syncd_session=forged"}),
    ]
    for method, path, headers in attempts:
        status, _, _ = await daemon.call(method, path, headers=headers)
        assert status in (400, 401, 403, 421), (method, path, status)
        refused += status != 400  # 400: the C parser refused the method before the app
    _, after = await scrape()
    assert refused >= 24
    count = UNAUTHORIZED.removesuffix("_total")  # the parser's name for the counter
    assert after[count][(UNAUTHORIZED, ())] == before[count][(UNAUTHORIZED, ())] + refused
    assert without_scrapes(after) == without_scrapes(before)


async def test_the_page_needs_the_token(daemon: Daemon) -> None:
    async with aiohttp.ClientSession() as session, session.get(daemon.url + "/metrics") as resp:
        assert resp.status == 401


async def test_an_outage_before_admission_is_counted_by_route() -> None:
    """A guard that cannot check a credential (the hub's database down: a 503 before
    ``admit``) is an outage, not a refusal: it shows by route, so a 5xx alert sees it."""
    metrics = Metrics()

    @web.middleware
    async def down(request: web.Request, handler: Handler) -> web.StreamResponse:
        return web.Response(status=503)

    async def never(request: web.Request) -> web.Response:
        raise AssertionError("the guard answers first")

    app = web.Application(middlewares=[metrics.middleware(), down])
    app.router.add_get("/v1/agent/status", never)
    async with serving_app(app) as url, aiohttp.ClientSession() as session:
        for method in ("GET", "PROPFIND"):
            async with session.request(method, url + "/v1/agent/status") as resp:
                assert resp.status == 503
    assert metrics.requests == {("/v1/agent/status", "GET", 503): 1,
                                ("unmatched", "other", 503): 1}
    assert metrics.unauthorized == 0
