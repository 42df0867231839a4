"""Which HTTP proxy, if any, the sync client reaches the control plane through.

Pure: the environment is a mapping passed in, nothing here does I/O, and the choice is made
once, when ``PlaneClient`` is made.

Rules:
  * Loopback clients never proxy. The CLI, the prompt hook and ``syncd mcp`` never come here
    (they read no proxy variable at all); and a plane whose host is loopback is reached
    directly whatever the environment says: a proxy's loopback is not this machine's.
  * The explicit option wins: ``control_plane.proxy``, when set, is used for every request,
    loopback plane included, whatever ``*_proxy`` or ``no_proxy`` say.
  * Otherwise the environment decides, chosen by the plane URL's scheme as curl and pip choose:
    ``https_proxy`` for an https:// plane, ``http_proxy`` for an http:// one, then
    ``all_proxy``. Lowercase before uppercase; an empty value is unset; a value with no scheme
    means http://. An unusable one (SOCKS, a path) is ignored with a warning, as aiohttp and
    pip ignore one.
  * ``no_proxy`` (lowercase first) sends the plane direct when it names the plane's host:
    ``*``; a name equal to the host or one of its domains (``example.com``, ``.example.com``
    and ``*.example.com`` each match ``a.example.com``, ``ample.com`` does not); an IP address
    or a CIDR block holding it; any of those with ``:port`` (``[v6]:port``) only for that port.
    Case and a trailing dot do not matter.
  * Credentials are never logged: they leave the proxy's URL (which aiohttp quotes in its
    errors and we log) for ``Proxy.authorization``, which ``repr`` leaves out; a warning about
    a bad variable names the variable, never its value.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from syncd.config import check_proxy_url, is_loopback_host

log = logging.getLogger("syncd.sync")


@dataclass(frozen=True, slots=True)
class Proxy:
    """Where requests to the plane go first: ``url`` without credentials, which become
    ``authorization`` (a ``Proxy-Authorization`` value); ``source`` is ``control_plane.proxy``
    or the environment variable's name."""

    url: URL
    authorization: str | None = field(repr=False)
    source: str


def choose_proxy(plane_url: str, explicit: str | None, env: Mapping[str, str]) -> Proxy | None:
    """The proxy for ``plane_url`` (see the module doc), or None to connect directly. An
    unusable proxy variable (a SOCKS one, say) is ignored with a warning, as aiohttp and pip
    ignore one; ``explicit`` was validated with the config and raises ValueError if bad."""
    if explicit is not None:
        return _proxy(explicit, "control_plane.proxy")
    found = env_proxy(plane_url, env)
    if found is None:
        return None
    var, value = found
    try:
        return _proxy(value if "://" in value else "http://" + value, var)
    except ValueError as exc:  # the reason never repeats the value: it may hold a password
        log.warning("ignoring %s for the control plane: %s; connecting directly", var, exc)
        return None


def env_proxy(plane_url: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """``(variable, value)`` of the proxy variable that applies to ``plane_url``, or None."""
    parts = urllib.parse.urlsplit(plane_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if is_loopback_host(host) or bypasses(_variable(env, "no_proxy")[1], host, port):
        return None
    for name in (f"{parts.scheme}_proxy", "all_proxy"):
        var, value = _variable(env, name)
        if value:
            return var, value
    return None


def _variable(env: Mapping[str, str], name: str) -> tuple[str, str]:
    """The lowercase variable, else the uppercase one; an empty value is unset."""
    for var in (name, name.upper()):
        if value := env.get(var, "").strip():
            return var, value
    return name, ""


def bypasses(no_proxy: str, host: str, port: int) -> bool:
    """True when the ``no_proxy`` list (comma-separated) names ``host``: ``*``; a name equal to
    the host or one of its domains (``example.com``, ``.example.com`` and ``*.example.com``
    each match ``a.example.com``); an IP address or CIDR block holding it; an entry with a
    ``:port`` only for that port. Case and a trailing dot do not matter."""
    host = host.lower().rstrip(".")
    entries = (entry.strip().lower() for entry in no_proxy.split(","))
    return any(entry == "*" or (entry and _names(entry, host, port)) for entry in entries)


def _names(entry: str, host: str, port: int) -> bool:
    name, wanted = _split_entry(entry)
    if wanted is not None and wanted != port:
        return False
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(name, strict=False)
    except ValueError:  # the host or the entry is a name
        pass
    name = name.lstrip("*").lstrip(".").rstrip(".")
    return bool(name) and (host == name or host.endswith("." + name))


def _split_entry(entry: str) -> tuple[str, int | None]:
    """``name[:port]``, ``[ipv6][:port]`` or a bare IPv6 address → (name, port or None)."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        name, _, port = entry.partition(":")
    else:
        name, port = entry, ""
    return name, int(port) if port.isdigit() else None


def _proxy(text: str, source: str) -> Proxy:
    url = URL(check_proxy_url(text))
    has_auth = url.user is not None or url.password is not None
    auth = aiohttp.encode_basic_auth(url.user or "", url.password or "") if has_auth else None
    return Proxy(url.with_user(None), auth, source)
