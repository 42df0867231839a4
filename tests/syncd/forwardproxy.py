"""A real forward HTTP proxy on a loopback port, recording every connection and request.

Rules:
  * Each accepted connection is counted in ``connections`` before a byte is read, so a client
    that connects and sends nothing (or something that is not HTTP) still counts.
  * Each request head is recorded in ``requests`` before it is answered.
  * A plain-HTTP request (absolute-form target, ``GET http://host:port/path``) goes to its host
    — or to the address ``hosts`` maps that name to, as a proxy resolves names its clients
    cannot — in origin form with ``Connection: close``; the answer comes back byte for byte,
    and the client's connection closes after it (one request per connection).
  * ``CONNECT host:port`` is answered 200 and tunnelled byte for byte both ways: TLS inside
    the tunnel is the client's and the server's, so the proxy records the target only.
  * With ``credentials``, a request without their ``Proxy-Authorization`` is answered 407 and
    goes nowhere.
  * ``close()`` ends every connection still open (tunnels a client keeps alive included).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

# Never forwarded: hop-by-hop (RFC 9110 §7.6.1) and the proxy's own.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authorization", "proxy-connection",
                         "te", "trailer", "upgrade"})
_DENIED = (b"HTTP/1.1 407 Proxy Authentication Required\r\n"
           b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n'
           b"Connection: close\r\n\r\n")


@dataclass(frozen=True)
class Seen:
    """One request head as the proxy read it; header names lower-cased."""

    method: str
    target: str
    headers: dict[str, str]


class ForwardProxy:
    def __init__(self, hosts: Mapping[str, str] | None = None,
                 credentials: tuple[str, str] | None = None) -> None:
        self.hosts = dict(hosts or {})
        self.connections = 0
        self.requests: list[Seen] = []
        self._wanted = None if credentials is None else "Basic " + base64.b64encode(
            ":".join(credentials).encode()).decode()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> ForwardProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError):
            pass  # a client that went away or did not speak HTTP: recorded, then dropped
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        first, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = first.split(" ", 2)
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines if line)}
        self.requests.append(Seen(method, target, headers))
        body = b"" if method == "CONNECT" else await reader.readexactly(
            int(headers.get("content-length", "0")))
        if self._wanted is not None and headers.get("proxy-authorization") != self._wanted:
            writer.write(_DENIED)
            await writer.drain()
        elif method == "CONNECT":
            await self._tunnel(target, reader, writer)
        else:
            await self._forward(method, target, headers, body, writer)

    def _address(self, host: str, port: int) -> tuple[str, int]:
        return self.hosts.get(host.lower(), host), port

    async def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes,
                       writer: asyncio.StreamWriter) -> None:
        parts = urllib.parse.urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an absolute http:// target: {target!r}")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        kept = "".join(f"{name}: {value}\r\n" for name, value in headers.items()
                       if name not in _HOP_BY_HOP)
        up_reader, up_writer = await asyncio.open_connection(
            *self._address(parts.hostname, parts.port or 80))
        try:
            up_writer.write(f"{method} {path} HTTP/1.1\r\n{kept}Connection: close\r\n\r\n"
                            .encode("latin-1") + body)
            await up_writer.drain()
            writer.write(await up_reader.read())  # the upstream closes after its answer
            await writer.drain()
        finally:
            up_writer.close()

    async def _tunnel(self, target: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        host, _, port = target.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(
            *self._address(host.strip("[]"), int(port)))
        try:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends, then end ``sink`` (a half-close, as TCP would)."""
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
