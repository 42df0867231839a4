"""A daemon that does not take a connection in time is not "not running".

A listening socket whose process does not accept (a daemon stopped with SIGSTOP, or swamped)
lets the kernel queue a few connections, then lets further ones time out. The CLI said
"syncd daemon is not running … start it with `syncd run`" (exit 75) — but a second daemon
cannot start while the first holds the data dir. It is a failed request (``ClientError``, exit
1) that says the daemon may be stopped or overloaded."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from syncd.client import Client, ClientError, DaemonDown


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port whose listening socket never accepts, its queue already full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    try:
        for _ in range(4):
            peer = socket.socket()
            peer.setblocking(False)
            peer.connect_ex(("127.0.0.1", port))
            queued.append(peer)
        yield port
    finally:
        for peer in queued:
            peer.close()
        server.close()


def test_a_connection_nobody_takes_is_a_failed_request(full_backlog: int) -> None:
    url = f"http://127.0.0.1:{full_backlog}"
    with pytest.raises(ClientError) as caught:
        Client(url, "token", timeout=0.5).call("GET", "/v1/agent/status")
    assert not isinstance(caught.value, DaemonDown), caught.value
    message = str(caught.value)
    assert message.startswith(f"the daemon at {url} did not take the request within 0.5 s"), message
    assert "not running" not in message and "\n" not in message


def test_nothing_listening_is_still_not_running() -> None:
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DaemonDown, match="is not running at"):
        Client(f"http://127.0.0.1:{port}", "token", timeout=0.5).call("GET", "/v1/agent/status")
