"""``sd_notify`` without libsystemd: one datagram to ``$NOTIFY_SOCKET`` per message.

systemd (``Type=notify``) passes the socket path in ``$NOTIFY_SOCKET`` (``@name`` is a Linux
abstract socket) and, with ``WatchdogSec=``, the interval in ``$WATCHDOG_USEC`` (for the process
named by ``$WATCHDOG_PID``, when set). Without systemd (launchd, a terminal) every call is a no-op
that returns False. Sends never block: the socket is non-blocking and a full queue is a dropped
message, not a stalled event loop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("syncd.notify")


def _address(env: Mapping[str, str]) -> str | None:
    path = env.get("NOTIFY_SOCKET", "")
    if path.startswith("@"):
        return "\0" + path[1:]  # abstract namespace
    return path if path.startswith("/") else None  # unset, or a vsock address we do not speak


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (e.g. ``"READY=1\\nSTATUS=serving …"``); True if it was sent."""
    address = _address(os.environ if env is None else env)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("sd_notify %r to %s failed: %s", message.split("\n", 1)[0],
                    address.replace("\0", "@"), exc)
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The service manager's watchdog timeout in seconds, or None when there is none for this
    process. Send ``WATCHDOG=1`` at half of it."""
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None
