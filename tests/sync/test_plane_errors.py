"""A failed request to the plane is reported in words with the URL it went to (issue 35):
"connection refused", "timed out", "TLS handshake failed", not aiohttp's class and repr.
Each case is a real socket on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from syncd.sync.plane import PlaneClient, Transient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def failure(url: str, request_secs: float = 30.0) -> str:
    client = PlaneClient(url, "token", timeout=request_secs, env={})
    try:
        with pytest.raises(Transient) as caught:
            await client.settings()
    finally:
        await client.close()
    return str(caught.value)


async def import_failure(url: str) -> Transient:
    client = PlaneClient(url, "token", env={})
    try:
        with pytest.raises(Transient) as caught:
            await client.import_rows(b'{"memory_nodes":[],"memory_edges":[]}')
    finally:
        await client.close()
    return caught.value


async def serving(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


@pytest.fixture
async def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connecting is refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_refused_connection_names_the_url_and_says_so(closed_port: int) -> None:
    message = await failure(f"http://127.0.0.1:{closed_port}")
    assert message.startswith(f"GET http://127.0.0.1:{closed_port}/v1/agent/memory/settings: "
                              "connection refused"), message
    assert "ClientConnectorError" not in message and "ssl:default" not in message
    # nothing reached the plane: the engine unmarks the batch
    assert (await import_failure(f"http://127.0.0.1:{closed_port}")).unsent


async def test_a_plane_that_never_answers_has_timed_out() -> None:
    held = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await held.wait()  # reads nothing, answers nothing, until the test ends
        writer.close()

    async for port in serving(silent):
        message = await failure(f"http://127.0.0.1:{port}", request_secs=0.2)
        held.set()
        assert message.endswith("/v1/agent/memory/settings: timed out"), message


async def test_a_plane_that_hangs_up_closed_the_connection() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    async for port in serving(hang_up):
        message = await failure(f"http://127.0.0.1:{port}")
        assert message.endswith("the plane closed the connection before answering"), message
        # sent: the plane may have committed it
        assert not (await import_failure(f"http://127.0.0.1:{port}")).unsent


async def test_https_to_a_plain_listener_is_a_failed_tls_handshake() -> None:
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async for port in serving(plain):
        message = await failure(f"https://127.0.0.1:{port}")
        assert f"https://127.0.0.1:{port}/v1/agent/memory/settings: TLS handshake failed: " \
            in message, message
