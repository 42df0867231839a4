"""Listen addresses and URLs, parsed and checked: ``host:port``, loopback or not, the URL a
client on this machine reaches a listener at, the plane's base URL and a proxy URL.

Rules:
  * Host names are never resolved: a name other than ``localhost`` is not loopback.
  * A bad value raises ValueError saying what is wrong, never repeating a password
    (``mask_password`` hides the one in ``scheme://user:password@host``); the config names the
    field it came from (``syncd/config.py``).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

# Host header values always accepted by the local API (RELIABILITY L2), before daemon.allowed_hosts.
LOOPBACK_HOST_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")

_USERINFO_PASSWORD = re.compile(r"(//[^/?#@\s:]*):[^/?#\s]*@")


def mask_password(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@`` in it shown as ``***``."""
    return _USERINFO_PASSWORD.sub(r"\1:***@", text)


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


def check_host(host: str) -> None:
    """Raise ValueError unless ``host`` is an IP address or a DNS host name (no brackets)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", host) or not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a valid host name or IP address")


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` or ``[ipv6]:port`` → ``(host, port)``, the host without brackets.
    Port 0 asks the OS for a free port. Raises ValueError naming what is wrong."""
    if "://" in text:
        raise ValueError("expected host:port, not a URL")
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError("expected [ipv6-address]:port")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            if re.fullmatch(r"[0-9]{1,5}", text):  # a bare port: the loopback address is meant
                raise ValueError(f"expected host:port; for this machine only, 127.0.0.1:{text}")
            raise ValueError("expected host:port, e.g. 127.0.0.1:7777")
        if ":" in host:
            raise ValueError("an IPv6 address needs brackets, e.g. [::1]:7777")
        if not host:
            raise ValueError("the host is empty")
        check_host(host)
    if not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IPs (``host`` without brackets or port); names are
    never resolved, so any other name counts as non-loopback."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_url(host: str, port: int) -> str:
    """The base URL a client on this machine reaches a listener on ``host:port`` at (``host``
    without brackets). A wildcard address (``0.0.0.0``, ``::``) is reached over loopback: it is
    no address to connect to, and the daemon's Host guard (RELIABILITY L2) refuses it."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        host = "127.0.0.1" if address.version == 4 else "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def check_plane_url(text: str) -> str:
    """``control_plane.url``: validate an ``http(s)://host[:port][/path]`` base URL; returns it
    without trailing ``/``."""
    if any(c.isspace() for c in text):
        raise ValueError("must not contain whitespace")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not contain credentials; use control_plane.token_file")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError("must not have a query or fragment")
    _check_authority(parts)
    return text.rstrip("/")


def _check_authority(parts: urllib.parse.SplitResult) -> None:
    """A URL's host is there and usable, and its port (if any) parses."""
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ValueError("has an invalid port") from None
    check_host(parts.hostname)


def check_proxy_url(text: str) -> str:
    """Validate an HTTP proxy URL, ``http(s)://[user:password@]host[:port][/]``, the form
    curl and pip take; returns it without a trailing ``/``. Raises ValueError saying what is
    wrong, never repeating the password."""
    if any(c.isspace() for c in text):
        raise ValueError("must not contain whitespace")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL, e.g. http://proxy.example.com:3128 "
                         "(SOCKS proxies are not supported)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError("must be scheme://host[:port], with no path, query or fragment")
    _check_authority(parts)
    return text.rstrip("/")
