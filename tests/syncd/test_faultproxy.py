"""FaultProxy against a real upstream on a real port: each fault kind, observed from both ends."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tests.syncd.faultproxy import Fault, FaultProxy

UPSTREAM_DATE = "Thu, 01 Jan 2026 00:00:00 GMT"
SINCE = "since=2026-01-01T00%3A00%3A00%2B00%3A00&q=a+b%20c"


@dataclass
class Upstream:
    url: str = ""
    n: int = 0
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)


def upstream_app(state: Upstream) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        state.seen.append((request.method, request.raw_path, dict(request.headers), b""))
        query = request.raw_path.partition("?")[2]
        return web.json_response(
            {"ok": True, "q": query, "pad": "x" * 64},
            headers={"Date": UPSTREAM_DATE, "X-Up": "1", "Retry-After": "7"},
        )

    async def count(request: web.Request) -> web.Response:
        body = await request.read()
        state.seen.append((request.method, request.raw_path, dict(request.headers), body))
        state.n += 1
        return web.json_response({"n": state.n})

    async def packed(request: web.Request) -> web.Response:
        body = gzip.compress(b'{"packed": true}')
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    async def denied(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": {"code": "unauthorized"}}, status=401,
            headers={"WWW-Authenticate": 'Bearer realm="plane"'},
        )

    app = web.Application()
    app.router.add_get("/v1/echo", echo)
    app.router.add_post("/v1/count", count)
    app.router.add_get("/v1/packed", packed)
    app.router.add_get("/v1/denied", denied)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    state = Upstream()
    runner = web.AppRunner(upstream_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(upstream.url) as p:
        yield p


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(autouse=True)
def _no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Neither server may log a handler error: a fault is the proxy's job, never its crash."""
    with caplog.at_level(logging.ERROR, logger="aiohttp"):
        yield
    phases = ("setup", "call", "teardown")
    records = [r for phase in phases for r in caplog.get_records(phase)]  # type: ignore[arg-type]
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []


async def post_count(client: aiohttp.ClientSession, proxy: FaultProxy) -> tuple[int, bytes]:
    async with client.post(proxy.url + "/v1/count", data=b'{"k":1}') as resp:
        return resp.status, await resp.read()


async def test_forwards_request_and_response_verbatim(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    # encoded=True: yarl would otherwise requote %3A to ':' in the client, before the proxy.
    url = URL(f"{proxy.url}/v1/echo?{SINCE}", encoded=True)
    async with client.get(url, headers={"X-Trace": "t1"}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"ok": True, "q": SINCE, "pad": "x" * 64}
        assert resp.headers["Date"] == UPSTREAM_DATE
        assert resp.headers["Retry-After"] == "7"
        assert resp.headers["X-Up"] == "1"
    method, raw_path, headers, _ = upstream.seen[0]
    assert (method, raw_path) == ("GET", f"/v1/echo?{SINCE}")
    assert headers["X-Trace"] == "t1"
    assert headers["Host"] == upstream.url.removeprefix("http://")

    assert await post_count(client, proxy) == (200, b'{"n": 1}')
    assert upstream.seen[1][3] == b'{"k":1}'
    got = [(c.method, c.path_qs, c.body, c.status, c.fault) for c in proxy.requests]
    assert got == [
        ("GET", f"/v1/echo?{SINCE}", b"", 200, None),
        ("POST", "/v1/count", b'{"k":1}', 200, None),
    ]
    assert proxy.requests[0].headers["X-Trace"] == "t1"


async def test_passes_encoded_bodies_and_auth_challenges_through(
    proxy: FaultProxy, client: aiohttp.ClientSession
) -> None:
    async with client.get(proxy.url + "/v1/packed") as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert await resp.json() == {"packed": True}
    async with client.get(proxy.url + "/v1/denied") as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == 'Bearer realm="plane"'


async def test_status_answers_without_reaching_upstream(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("status", status=503))
    status, body = await post_count(client, proxy)
    assert status == 503
    assert json.loads(body) == {"error": {"code": "injected", "message": "injected 503"}}
    assert upstream.n == 0
    assert await post_count(client, proxy) == (200, b'{"n": 1}')
    assert [c.fault for c in proxy.requests] == ["status", None]


async def test_retry_after_answers_429_with_header(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("retry_after", retry_after=2.0), Fault("retry_after", retry_after=0.5))
    for expected in ("2", "0.5"):
        async with client.post(proxy.url + "/v1/count") as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == expected
    assert upstream.n == 0


@pytest.mark.parametrize("kind", ["reset_mid_body", "drop_after_commit"])
async def test_connection_faults_fail_the_client_after_upstream_committed(
    kind: str, proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault(kind, method="POST"))  # type: ignore[arg-type]
    with pytest.raises(aiohttp.ClientError):
        await post_count(client, proxy)
    assert upstream.n == 1
    assert (proxy.requests[0].status, proxy.requests[0].fault) == (None, kind)
    assert await post_count(client, proxy) == (200, b'{"n": 2}')


async def test_reset_mid_body_sends_status_then_half_the_body(
    proxy: FaultProxy, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("reset_mid_body"))
    async with client.get(proxy.url + "/v1/echo") as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()


async def test_truncate_json_is_a_complete_response_with_half_the_json(
    proxy: FaultProxy, client: aiohttp.ClientSession
) -> None:
    async with client.get(proxy.url + "/v1/echo") as resp:
        whole = await resp.read()
    proxy.inject(Fault("truncate_json"))
    async with client.get(proxy.url + "/v1/echo") as resp:
        assert resp.status == 200
        body = await resp.read()
    assert body == whole[: len(whole) // 2]
    with pytest.raises(ValueError):
        json.loads(body)


async def test_timeout_gives_up_client_and_proxy_keeps_working(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("timeout", delay=5.0))
    with pytest.raises(TimeoutError):
        async with client.post(
            proxy.url + "/v1/count", timeout=aiohttp.ClientTimeout(total=0.2)
        ) as resp:
            await resp.read()
    assert await post_count(client, proxy) == (200, b'{"n": 1}')
    assert (proxy.requests[0].status, proxy.requests[0].fault) == (None, "timeout")


async def test_short_timeout_hold_then_forwards(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("timeout", delay=0.05))
    assert await post_count(client, proxy) == (200, b'{"n": 1}')
    assert proxy.requests[0].status == 200


async def test_close_ends_a_held_request_promptly(
    proxy: FaultProxy, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("timeout", delay=30.0))
    pending = asyncio.create_task(post_count(client, proxy))
    async with asyncio.timeout(2):
        await proxy.wait_count(1, "POST", "/v1/count")
    await asyncio.wait_for(proxy.close(), 2)
    with pytest.raises(aiohttp.ClientError):
        await pending


async def test_offline_closes_every_connection_without_a_response(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.offline = True
    with pytest.raises(aiohttp.ClientError):
        await post_count(client, proxy)
    with pytest.raises(aiohttp.ClientError):
        await client.get(proxy.url + "/v1/echo")
    assert upstream.n == 0
    assert {c.fault for c in proxy.requests} == {"offline"}
    proxy.offline = False
    assert await post_count(client, proxy) == (200, b'{"n": 1}')


async def test_filters_pick_only_matching_requests_in_fifo_order(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(
        Fault("status", status=500, path="/count"),
        Fault("status", status=502, method="GET"),
        Fault("status", status=413, path="/count"),
    )
    assert (await post_count(client, proxy))[0] == 500
    async with client.get(proxy.url + "/v1/echo") as resp:
        assert resp.status == 502
    async with client.get(proxy.url + "/v1/echo") as resp:
        assert resp.status == 200
    assert (await post_count(client, proxy))[0] == 413
    assert await post_count(client, proxy) == (200, b'{"n": 1}')
    assert proxy.count() == 5
    assert proxy.count("POST") == 3
    assert proxy.count(path="/v1/echo") == 2
    assert proxy.count("GET", "/count") == 0


async def test_fail_always_is_sticky_until_cleared(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.inject(Fault("status", status=500))
    proxy.fail_always(Fault("status", status=503, path="/count"))
    for _ in range(3):
        assert (await post_count(client, proxy))[0] == 503
    proxy.fail_always(None)
    assert (await post_count(client, proxy))[0] == 500  # the queue was not consumed meanwhile
    assert await post_count(client, proxy) == (200, b'{"n": 1}')


async def test_fail_always_reset_is_a_network_outage(
    proxy: FaultProxy, upstream: Upstream, client: aiohttp.ClientSession
) -> None:
    proxy.fail_always(Fault("drop_after_commit"))
    with pytest.raises(aiohttp.ClientError):
        await client.get(proxy.url + "/v1/echo")
    assert proxy.count("GET") == 2  # aiohttp retried the idempotent GET once; both dropped


async def test_one_drop_on_a_get_is_hidden_by_aiohttp_retry(
    proxy: FaultProxy, client: aiohttp.ClientSession
) -> None:
    """A pitfall for tests, not a proxy feature: aiohttp resends an idempotent request once after
    a disconnect, so a single queued drop on a GET is invisible to the client."""
    proxy.inject(Fault("drop_after_commit", method="GET"))
    async with client.get(proxy.url + "/v1/echo") as resp:
        assert resp.status == 200
    assert [c.fault for c in proxy.requests] == ["drop_after_commit", None]


async def test_unreachable_upstream_answers_502(client: aiohttp.ClientSession) -> None:
    async with FaultProxy("http://127.0.0.1:9") as proxy, client.get(proxy.url + "/x") as resp:
        assert resp.status == 502
        assert (await resp.json())["error"]["code"] == "upstream_unreachable"


def test_unknown_fault_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'boom'"):
        Fault("boom")  # type: ignore[arg-type]
