"""A real HTTP reverse proxy that injects scripted faults between a client and its upstream.

Rules:
- A request without a fault is forwarded verbatim: method, the raw request target (percent-encoding
  kept byte for byte), body, and every header except the hop-by-hop ones; the upstream's status,
  body and headers come back the same way (bodies are never decompressed or re-encoded).
- Precedence per request: `offline`, then the sticky `fail_always` fault, then the first queued
  `inject` fault that matches (consumed). A sticky fault does not consume the queue.
- Faults that forward ("timeout", "reset_mid_body", "truncate_json", "drop_after_commit") let the
  upstream finish the request first: the plane committed, then the client saw the failure.
- Every request is recorded in `requests` before it is handled, so a request whose client gave
  up (status None) is still counted.
- Handlers are cancelled when their client disconnects, and `close()` ends held requests at
  once, so a held "timeout" never outlives its test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

FaultKind = Literal[
    "timeout", "status", "reset_mid_body", "truncate_json", "retry_after", "drop_after_commit"
]
FAULT_KINDS: frozenset[str] = frozenset(get_args(FaultKind))

# RFC 9110 §7.6.1 connection-specific headers, plus the framing headers the proxy recomputes.
HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
    }
)


@dataclass(frozen=True)
class Fault:
    """One scripted fault; `path` (a substring of the request path) and `method` narrow it."""

    kind: FaultKind
    status: int = 503
    retry_after: float = 1.0
    delay: float = 30.0
    path: str | None = None
    method: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            kinds = ", ".join(sorted(FAULT_KINDS))
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {kinds}")

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method.upper() == method.upper()) and (
            self.path is None or self.path in path
        )


@dataclass
class Captured:
    """One request as the proxy saw it. `status` is the complete response the client got: None
    when the connection was reset or dropped, or the client gave up during a "timeout" hold."""

    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    fault: FaultKind | Literal["offline"] | None = None

    @property
    def path(self) -> str:
        return self.path_qs.partition("?")[0]


@dataclass
class _Upstream:
    status: int
    headers: CIMultiDict[str]
    body: bytes = field(repr=False)


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def retry_after_value(seconds: float) -> str:
    """Whole seconds as an integer string ("2"), anything else as a decimal ("0.5")."""
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


def end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Every header pair (repeats kept, in order) except the hop-by-hop ones."""
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def abort(request: web.BaseRequest) -> web.StreamResponse:
    """Close the client's connection with no further bytes. The returned response is never sent:
    aiohttp treats the failed write to the closed transport as a client disconnect."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response()


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.offline = False
        self.requests: list[Captured] = []
        self._queue: list[Fault] = []
        self._sticky: Fault | None = None
        self._closing = asyncio.Event()
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application(client_max_size=1 << 30)  # the upstream enforces its own limit
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def inject(self, *faults: Fault) -> None:
        self._queue.extend(faults)

    def fail_always(self, fault: Fault | None) -> None:
        self._sticky = fault

    def count(self, method: str | None = None, path: str | None = None) -> int:
        probe = Fault("status", method=method, path=path)
        return sum(probe.matches(c.method, c.path) for c in self.requests)

    async def wait_count(
        self, n: int, method: str | None = None, path: str | None = None
    ) -> None:
        """Return once `count(method, path) >= n` (bound it with asyncio.timeout)."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: self.count(method, path) >= n)

    def _pick(self, method: str, path: str) -> Fault | None:
        if self._sticky is not None and self._sticky.matches(method, path):
            return self._sticky
        for i, fault in enumerate(self._queue):
            if fault.matches(method, path):
                return self._queue.pop(i)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        captured = Captured(request.method, request.raw_path, dict(request.headers), b"")
        self.requests.append(captured)
        async with self._arrived:
            self._arrived.notify_all()
        if self.offline:
            captured.fault = "offline"
            return abort(request)
        captured.body = await request.read()
        fault = self._pick(request.method, captured.path)
        captured.fault = fault.kind if fault is not None else None
        return await self._respond(request, captured, fault)

    async def _respond(
        self, request: web.Request, captured: Captured, fault: Fault | None
    ) -> web.StreamResponse:
        kind = captured.fault
        if fault is not None and kind in ("status", "retry_after"):
            captured.status = fault.status if kind == "status" else 429
            response = injected(captured.status)
            if kind == "retry_after":
                response.headers["Retry-After"] = retry_after_value(fault.retry_after)
            return response
        if fault is not None and kind == "timeout" and not await self._hold(fault.delay):
            return abort(request)
        upstream = await self._forward(request, captured.body)
        if kind == "drop_after_commit":
            return abort(request)
        if kind == "reset_mid_body":
            return await reset_mid_body(request, upstream)
        body = upstream.body
        if kind == "truncate_json":
            body = body[: len(body) // 2]
        captured.status = upstream.status
        return web.Response(status=upstream.status, body=body, headers=upstream.headers)

    async def _hold(self, delay: float) -> bool:
        """Wait `delay` seconds; False if the proxy started closing first."""
        try:
            await asyncio.wait_for(self._closing.wait(), delay)
        except TimeoutError:
            return True
        return False

    async def _forward(self, request: web.Request, body: bytes) -> _Upstream:
        assert self._session is not None, "FaultProxy.start() was not awaited"
        url = URL(self.upstream + request.raw_path, encoded=True)
        try:
            async with self._session.request(
                request.method,
                url,
                headers=end_to_end(request.headers),
                data=body or None,
                allow_redirects=False,
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
            ) as resp:
                return _Upstream(resp.status, end_to_end(resp.headers), await resp.read())
        except aiohttp.ClientError as exc:
            message = f"upstream {self.upstream} failed: {exc!r}"
            headers = CIMultiDict({"Content-Type": "application/json"})
            return _Upstream(502, headers, error_body("upstream_unreachable", message))


def injected(status: int) -> web.Response:
    return web.Response(
        status=status,
        body=error_body("injected", f"injected {status}"),
        content_type="application/json",
    )


async def reset_mid_body(request: web.Request, upstream: _Upstream) -> web.StreamResponse:
    """Send the upstream's status and headers, declare the full length, write half the body,
    then reset. An empty body declares one byte so the client still sees a short read."""
    response = web.StreamResponse(status=upstream.status, headers=upstream.headers)
    response.content_length = max(len(upstream.body), 1)
    await response.prepare(request)
    await response.write(upstream.body[: len(upstream.body) // 2])
    return abort(request)
