"""sd_notify: `syncd run` under a fake service manager (a real AF_UNIX datagram socket)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from syncd.notify import notify, watchdog_interval
from tests.syncd.test_daemon import finish, start


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.setblocking(False)
    try:
        yield sock, str(path)
    finally:
        sock.close()


async def receive(sock: socket.socket, limit: float = 30.0) -> str:
    async with asyncio.timeout(limit):
        return (await asyncio.get_running_loop().sock_recv(sock, 4096)).decode()


async def test_ready_after_bind_then_watchdog_then_stopping(
        tmp_path: Path, manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0", NOTIFY_SOCKET=path,
                       WATCHDOG_USEC="400000")
    stopped = False
    try:
        first = await receive(sock)
        assert "READY=1" in first.split("\n"), first
        url = json.loads((data / "daemon.json").read_text())["url"]
        assert f"STATUS=serving {url}" in first
        split = urlsplit(url)
        assert split.hostname is not None and split.port is not None
        _, writer = await asyncio.open_connection(split.hostname, split.port)  # accepts now
        writer.close()
        await writer.wait_closed()
        heartbeats = 0
        while heartbeats < 2:
            message = await receive(sock, limit=5.0)
            assert message == "WATCHDOG=1", message
            heartbeats += 1
        proc.send_signal(signal.SIGTERM)
        stopped = True
        while (message := await receive(sock, limit=10.0)) == "WATCHDOG=1":
            pass
        assert message == "STOPPING=1"
    finally:
        if not stopped:
            proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err


def test_notify_without_a_socket_is_a_no_op() -> None:
    assert notify("READY=1", env={}) is False
    assert notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"}) is False


def test_notify_to_an_abstract_socket() -> None:
    name = f"syncd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("READY=1\nSTATUS=ok", env={"NOTIFY_SOCKET": "@" + name}) is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"


def test_notify_to_a_missing_socket_fails_softly(tmp_path: Path) -> None:
    assert notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False


def test_watchdog_interval() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    mine = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": mine}) == 0.4
    assert watchdog_interval({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}) is None
