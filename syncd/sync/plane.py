"""``PlaneClient``: the control plane's sync routes over HTTP, and how their failures are told
apart.

Rules:
  * ``since`` goes in the query string URL-encoded (a raw ``+`` would decode to a space).
  * Failures are classified once, here: ``AuthFailed`` (401/403 — never retried in a loop),
    ``TooLarge`` (413 — the caller splits the batch), ``Transient`` (timeouts, resets, 5xx, 429
    with its ``Retry-After``, truncated or malformed JSON — back off and retry), ``Rejected``
    (any other 4xx — surfaced in status and the log; retried with the same capped backoff
    as a transient failure, since a plane fixed by its operator should be used again).
  * A ``changes`` page read with ``unreadable`` costs only its bad rows when some of them do
    not fit the row schema (RELIABILITY R5): they come back as ``UnreadableRow``s, the rest as
    rows. A body that is not JSON, or whose envelope is wrong, is still ``Transient``.
  * Every outbound body passes the egress guard: one with a JSON string that still holds a
    ``<private`` opener — as the redactor defines it, so ``<privateKey>`` is not one (P2) — is
    refused before it is sent (RELIABILITY P6) and counted.
  * Each response records the server's ``Date`` and the local send/receive instants, so the
    engine can estimate the offset between this machine's clock and the plane's.
  * The proxy is chosen once, when the client is made, by ``syncd.sync.proxy`` (its rules are
    there). An https:// plane is reached through a CONNECT tunnel: TLS stays end to end.
    aiohttp's ``trust_env`` is off: it would also read ``~/.netrc``.
  * A proxy's credentials are in no log line and no error: aiohttp gets the proxy's URL
    without them (its errors quote that URL); they travel as ``Proxy-Authorization``, on a
    plain-HTTP request itself, for an https:// plane on the CONNECT only (never into the
    tunnel, where the plane would read them).
  * Long-poll (docs/long-poll.md): every ``changes`` answer's ``Syncd-Long-Poll`` header (a
    syncd hub's advertisement; Kyma sends none) is kept in ``long_poll_secs``, None without
    it. ``poll_changes`` holds one such request (its read timeout is the wait plus the
    client's timeout) and is counted in ``polls``, never in ``requests`` or the byte counts,
    which a pass running beside it reports as its own.
  * The plane's bearer token goes on each request, never in the session's default headers:
    aiohttp copies a session's default ``Authorization`` into ``Proxy-Authorization``, which
    would hand the token to the proxy (on the CONNECT too, outside TLS).
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import io
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import msgspec

from local_store.redact import contains_private_marker, strip_private
from protocol.rows import (
    ChangesResponse,
    EdgeRow,
    ExportBody,
    ImportResult,
    NodeRow,
    changes_decoder,
    export_decoder,
    import_result_decoder,
)
from protocol.settings import MemorySettings, settings_decoder
from syncd.hub.longpoll import HEADER as LONG_POLL_HEADER
from syncd.sync.proxy import choose_proxy
from syncd.sync.spool import SPOOL_FROM, Spool

log = logging.getLogger("syncd.sync")

T = TypeVar("T")
P = TypeVar("P", ChangesResponse, ExportBody)
IMPORT_PATH = "/v1/agent/memory/import"
CHANGES_PATH = "/v1/agent/memory/changes"
EXPORT_PATH = "/v1/agent/memory/export"
# JSON's string token (RFC 8259 §7), not a tag rule: the guard decodes each string and asks
# the redactor's own ``contains_private_marker``.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"')
_string_decoder = msgspec.json.Decoder(str)


class _Entitlement(msgspec.Struct):
    token: str


_entitlement_decoder = msgspec.json.Decoder(_Entitlement)


class PlaneError(Exception):
    kind = "error"

    def __init__(self, message: str, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class AuthFailed(PlaneError):
    kind = "auth"


class TooLarge(PlaneError):
    kind = "too_large"


class Transient(PlaneError):
    kind = "transient"
    unsent = False  # True: no connection was made, so the plane received nothing


_ERRNO_WORDS = {errno.ECONNREFUSED: "connection refused (is the plane running, and on this "
                "port?)", errno.ECONNRESET: "connection reset",
                errno.EHOSTUNREACH: "host unreachable", errno.ENETUNREACH: "network unreachable",
                errno.ETIMEDOUT: "timed out"}


def in_words(exc: BaseException) -> str:
    """A failed request's cause as a person says it ("connection refused", "timed out",
    "TLS handshake failed: …"), not aiohttp's class and repr; anything else keeps both."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS handshake failed: {getattr(exc, 'os_error', exc)}"
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(
            getattr(exc, "os_error", None), socket.gaierror):
        return "host name not found"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _ERRNO_WORDS.get(exc.errno or 0, f"cannot connect: {exc.strerror or exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the plane closed the connection before answering"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer was cut short"
    return f"{type(exc).__name__}: {exc}"


class Rejected(PlaneError):
    kind = "rejected"


class EgressRefused(PlaneError):
    kind = "egress_refused"


@dataclass(slots=True)
class UnreadableRow:
    """A ``changes`` row that does not fit the row schema; shaped as the store's
    ``RowProblem`` so the engine holds the cursor for it the same way (R5)."""

    kind: str
    index: int  # in the page's array
    id: str | None
    field: str | None
    message: str


@dataclass(slots=True)
class Timing:
    sent_ns: int
    received_ns: int
    date_ns: int | None  # the server's Date header (1 s resolution), if any


FETCH_LIMIT_SECS = 3600.0  # a whole GET: a first pull of a large plane over a slow link
SEND_LIMIT_FACTOR = 10  # a whole POST, in client timeouts


class PlaneClient:
    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0,
                 wall: Any = time.time_ns, fetch_limit: float = FETCH_LIMIT_SECS,
                 proxy: str | None = None, env: Mapping[str, str] | None = None,
                 spool_from: int = SPOOL_FROM) -> None:
        """``proxy``: ``control_plane.proxy``; ``env``: where proxy variables are read (this
        process's environment when None); ``spool_from``: the size from which a page's body
        is kept on disk (``spool.py``)."""
        self.url = url.rstrip("/")
        self.proxy = choose_proxy(self.url, proxy, os.environ if env is None else env)
        credentials = {} if self.proxy is None or self.proxy.authorization is None else {
            "Proxy-Authorization": self.proxy.authorization}
        tunnelled = self.url.startswith("https:")
        self._proxy_headers = credentials if tunnelled else None  # on the CONNECT
        self._proxied_headers = {} if tunnelled else credentials  # on each request
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}  # each request
        # ``timeout`` bounds a silence (connecting, or waiting for the next bytes), not a whole
        # transfer: the plane's ``changes`` is one unpaged body, which for a first pull of a
        # large plane over a slow link takes longer than ``timeout``. A whole request is still
        # bounded, so a plane that stops reading a push or trickles an answer cannot hold the
        # pass (and every later one, queued behind it) forever: a GET by ``fetch_limit``, a
        # POST (its body at most ``push_batch_bytes``) by ``SEND_LIMIT_FACTOR`` × ``timeout``.
        def limit(total: float) -> aiohttp.ClientTimeout:
            return aiohttp.ClientTimeout(total=total, connect=timeout,
                                         sock_connect=min(timeout, 10.0), sock_read=timeout)
        self._timeout = limit(max(fetch_limit, timeout))
        self._timeout_secs = timeout
        self._send_timeout = limit(SEND_LIMIT_FACTOR * timeout)
        self._session: aiohttp.ClientSession | None = None
        self._wall = wall
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.egress_refusals = 0
        self.last_timing: Timing | None = None
        self.long_poll_secs: float | None = None  # what the last ``changes`` answer offered
        self.polls = 0  # long-polls sent (``poll_changes``)
        self.spool_from = spool_from
        self.spooled = 0  # bodies kept on disk

    async def set_token(self, token: str | None) -> None:
        """Use another bearer token from the next request on (a rotated token file)."""
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self.proxy is not None:
                log.info("reaching the control plane %s through the proxy %s (from %s)",
                         self.url, self.proxy.url, self.proxy.source)
            self._session = aiohttp.ClientSession(timeout=self._timeout, trust_env=False)
        return self._session

    async def changes(self, since: str | None, realm: str | None, limit: int | None,
                      exclude_origin: str | None = None, *,
                      unreadable: list[UnreadableRow] | None = None) -> ChangesResponse:
        """With ``unreadable``, rows that do not fit the row schema go there and the rest of
        the page is returned (R5); without it, such a row fails the page (``Transient``)."""
        params = _changes_params(since, realm, limit, exclude_origin)
        return await self._get_page(CHANGES_PATH, params, changes_decoder, ChangesResponse,
                                    unreadable)

    async def poll_changes(self, since: str, realm: str | None, exclude_origin: str | None,
                           wait: float) -> ChangesResponse | None:
        """A long-poll: at most one row of the changes after ``since``, answered as soon as
        the hub has any or after ``wait`` seconds. None when the answer holds a row that does
        not fit the row schema (there is something to pull: the pass reads it row by row)."""
        params = {**_changes_params(since, realm, 1, exclude_origin), "wait": f"{wait:g}"}
        self.polls += 1
        data = await self._request("GET", CHANGES_PATH, params, None,
                                   limits=self._poll_limits(wait), counted=False)
        try:
            return changes_decoder.decode(data)
        except msgspec.ValidationError:
            return None
        except msgspec.DecodeError as exc:
            raise Transient(f"{CHANGES_PATH}: malformed response: {exc}") from None

    def _poll_limits(self, wait: float) -> aiohttp.ClientTimeout:
        """A poll's read may take ``wait`` seconds more than any other request's."""
        secs = self._timeout_secs
        return aiohttp.ClientTimeout(total=wait + secs, connect=secs,
                                     sock_connect=min(secs, 10.0), sock_read=wait + secs)

    async def changes_spooled(self, since: str | None, realm: str | None, limit: int | None,
                              exclude_origin: str | None = None, *,
                              unreadable: list[UnreadableRow],
                              held: Callable[[object], bool] | None = None,
                              ) -> tuple[ChangesResponse, Spool | None]:
        """As ``changes`` with ``unreadable``; a body over ``spool_from`` bytes stays on disk
        and comes back as the page's envelope (no rows) and its ``Spool`` (``spooled_rows``
        reads it; the caller closes it). ``held``: as ``Spool.envelope``'s."""
        params = _changes_params(since, realm, limit, exclude_origin)
        return await self._get_spooled(CHANGES_PATH, params, changes_decoder, ChangesResponse,
                                       unreadable, held)

    async def export_spooled(self, realm: str | None, limit: int | None, cursor: str | None,
                             *, unreadable: list[UnreadableRow],
                             held: Callable[[object], bool] | None = None,
                             ) -> tuple[ExportBody, Spool | None]:
        """As ``export`` with ``unreadable``, spooled as ``changes_spooled``."""
        params = _export_params(realm, limit, cursor)
        return await self._get_spooled(EXPORT_PATH, params, export_decoder, ExportBody,
                                       unreadable, held)

    async def export(self, realm: str | None, limit: int | None,
                     cursor: str | None, *,
                     unreadable: list[UnreadableRow] | None = None) -> ExportBody:
        """As ``changes``: with ``unreadable``, a row that does not fit the row schema costs
        only itself."""
        params = _export_params(realm, limit, cursor)
        return await self._get_page(EXPORT_PATH, params, export_decoder, ExportBody, unreadable)

    async def entitlement(self, device_id: str) -> tuple[str, int | None]:
        """An entitlement token for this device, and the server's clock (``Date``) in s."""
        data = await self._request("GET", "/v1/agent/entitlement", {"device_id": device_id},
                                   None)
        try:
            token = _entitlement_decoder.decode(data).token
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Transient(f"entitlement: malformed response: {exc}") from None
        timing = self.last_timing
        date = None if timing is None or timing.date_ns is None else timing.date_ns // 10**9
        return token, date

    async def settings(self) -> MemorySettings:
        return await self._get("/v1/agent/memory/settings", {}, settings_decoder)

    async def import_rows(self, body: bytes) -> ImportResult:
        if _holds_private(body):
            self.egress_refusals += 1
            raise EgressRefused("an outbound body still contains <private: refused to send")
        data = await self._request("POST", IMPORT_PATH, {}, body)
        try:
            return import_result_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise Transient(f"import: malformed response: {exc}") from None

    async def _get(self, path: str, params: dict[str, str],
                   decoder: msgspec.json.Decoder[T]) -> T:
        data = await self._request("GET", path, params, None)
        try:
            return decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Transient(f"{path}: malformed response: {exc}") from None

    async def _get_page(self, path: str, params: dict[str, str],
                        decoder: msgspec.json.Decoder[P], page_type: type[P],
                        unreadable: list[UnreadableRow] | None) -> P:
        """A page of rows; with ``unreadable``, read row by row when a row does not fit."""
        if unreadable is None:
            return await self._get(path, params, decoder)
        data = await self._request("GET", path, params, None)
        page, rows = decode_rows(data, decoder, page_type, path)
        unreadable.extend(rows)
        return page

    async def _get_spooled(self, path: str, params: dict[str, str],
                           decoder: msgspec.json.Decoder[P], page_type: type[P],
                           unreadable: list[UnreadableRow],
                           held: Callable[[object], bool] | None = None,
                           ) -> tuple[P, Spool | None]:
        data = await self._request("GET", path, params, None, spool_from=self.spool_from)
        if not isinstance(data, Spool):
            page, rows = decode_rows(data, decoder, page_type, path)
            unreadable.extend(rows)
            return page, None
        self.spooled += 1
        try:
            envelope = await data.envelope(held)
            envelope.pop("memory_nodes", None)
            envelope.pop("memory_edges", None)
            return msgspec.convert(envelope, page_type), data
        except (ValueError, msgspec.ValidationError) as exc:  # not JSON, or a wrong envelope
            data.close()
            raise Transient(f"{path}: malformed response ({data.size} bytes): {exc}") from None

    async def _request(self, method: str, path: str, params: dict[str, str],
                       body: bytes | None, *, spool_from: int | None = None,
                       limits: aiohttp.ClientTimeout | None = None,
                       counted: bool = True) -> Any:
        """``counted=False`` (a long-poll) leaves ``requests``, the byte counts and
        ``last_timing`` to the passes."""
        session = self._open()
        headers = {**self._headers, **self._proxied_headers,
                   **({"Content-Type": "application/json"} if body is not None else {})}
        sent = self._wall()
        if counted:
            self.requests += 1
        proxy = self.proxy
        if limits is None:
            limits = self._timeout if body is None else self._send_timeout
        try:
            # a body as a stream: aiohttp writes raw bytes over 1 MiB in one piece (and warns)
            stream = None if body is None else io.BytesIO(body)
            async with session.request(method, self.url + path, params=params, data=stream,
                                       headers=headers, timeout=limits,
                                       proxy=None if proxy is None else proxy.url,
                                       proxy_headers=self._proxy_headers) as resp:
                data = await (resp.read() if spool_from is None or resp.status >= 300
                              else _read_or_spool(resp, spool_from))
                if counted:
                    self.last_timing = Timing(sent, self._wall(),
                                              _date_ns(resp.headers.get("Date")))
                status, retry_after = resp.status, _retry_after(resp.headers.get("Retry-After"))
                if path == CHANGES_PATH:
                    self.long_poll_secs = _seconds(resp.headers.get(LONG_POLL_HEADER))
        except (aiohttp.ClientError, TimeoutError) as exc:
            via = "" if proxy is None else f" (through the proxy {proxy.url}, from {proxy.source})"
            failure = Transient(f"{method} {self.url}{path}: {in_words(exc)}{via}")
            # connecting failed (refused, no such host, TLS handshake): not a byte was sent
            failure.unsent = isinstance(exc, aiohttp.ClientConnectorError)
            raise failure from None
        if counted:
            self.bytes_out += len(body or b"")
            self.bytes_in += data.size if isinstance(data, Spool) else len(data)
        if 200 <= status < 300:
            return data
        head = data[:200] if isinstance(data, bytes) else b""  # a refusal is never spooled
        detail = f"{method} {path}: HTTP {status}: {head.decode(errors='replace')}"
        if status in (401, 403):
            raise AuthFailed(detail, status)
        if status == 413:
            raise TooLarge(detail, status)
        if status in (408, 425, 429) or status >= 500:
            raise Transient(detail, status, retry_after)
        raise Rejected(detail, status)


def _changes_params(since: str | None, realm: str | None, limit: int | None,
                    exclude_origin: str | None) -> dict[str, str]:
    params = {"since": since or ""}
    for name, value in (("exclude_origin", exclude_origin), ("realm", realm),
                        ("limit", None if limit is None else str(limit))):
        if value is not None:
            params[name] = value
    return params


def _export_params(realm: str | None, limit: int | None, cursor: str | None) -> dict[str, str]:
    return {name: value for name, value in (
        ("realm", realm), ("limit", None if limit is None else str(limit)), ("cursor", cursor))
        if value is not None}


async def _read_or_spool(resp: aiohttp.ClientResponse, spool_from: int) -> bytes | Spool:
    """The body in memory while it is at most ``spool_from`` bytes; a larger one goes on to an
    anonymous temporary file as it arrives (``spool.py``)."""
    head = bytearray()
    async for piece in resp.content.iter_chunked(1 << 20):
        head += piece
        if len(head) > spool_from:
            break
    else:
        return bytes(head)
    file = await asyncio.to_thread(tempfile.TemporaryFile)
    try:
        size = len(head)
        await asyncio.to_thread(file.write, head)
        del head
        async for piece in resp.content.iter_chunked(1 << 20):
            size += len(piece)
            await asyncio.to_thread(file.write, piece)
    except BaseException:
        file.close()
        raise
    return Spool(file, size)


async def spooled_rows(spool: Spool, unreadable: list[UnreadableRow],
                       ) -> AsyncIterator[tuple[list[NodeRow], list[EdgeRow]]]:
    """A spooled page's rows a batch at a time (nodes or edges); rows that do not fit the row
    schema go to ``unreadable`` with their index in the page's array, as ``decode_rows``.
    One batch is held at a time: the caller drops its rows before asking for the next."""
    async for key, batch in spool.batches():
        kind = "node" if key == "memory_nodes" else "edge"
        row_type = NodeRow if kind == "node" else EdgeRow
        rows = _convert_indexed(kind, batch, row_type, unreadable)
        del batch  # the raw rows (a list of floats each) are not held while these are applied
        yield (rows, []) if kind == "node" else ([], rows)  # type: ignore[misc]
        del rows  # nor these while the next batch is read


def decode_rows(data: bytes, decoder: msgspec.json.Decoder[P], page_type: type[P],
                path: str) -> tuple[P, list[UnreadableRow]]:
    """A page (``changes`` or ``export``), and its rows that are not rows. The typed decode
    runs first (the fast path); only when it fails validation is the body decoded generically
    and converted row by row, so one row of a wrong type costs only itself, not the page (R5).

    A ``null`` inside an ``embedding`` — how the plane's JSON writer emits a NaN or an
    infinity — makes its row unreadable like any other wrong type, not a row with no vector:
    the store refuses a non-finite vector as a bad row too (``local_store.apply``), so one
    rule covers both, and the row is skipped after ``BAD_ROW_PASSES`` and reported."""
    try:
        return decoder.decode(data), []
    except msgspec.ValidationError:
        pass  # valid JSON so far: read it row by row below
    except msgspec.DecodeError as exc:
        raise Transient(f"{path}: malformed response: {exc}") from None
    try:  # a truncated body can fail validation before its syntax error is reached
        raw = msgspec.json.decode(data, type=dict[str, Any])
        nodes = msgspec.convert(raw.pop("memory_nodes", []), list[Any])
        edges = msgspec.convert(raw.pop("memory_edges", []), list[Any])
        page = msgspec.convert(raw, page_type)
    except msgspec.DecodeError as exc:  # ValidationError included: the envelope is wrong
        raise Transient(f"{path}: malformed response: {exc}") from None
    unreadable: list[UnreadableRow] = []
    page.memory_nodes = _convert_rows("node", nodes, NodeRow, unreadable)
    page.memory_edges = _convert_rows("edge", edges, EdgeRow, unreadable)
    return page, unreadable


_AT_FIELD = re.compile(r" - at `\$\.(\w+)")


def _convert_rows(kind: str, raw: list[Any], row_type: type[T],
                  unreadable: list[UnreadableRow]) -> list[T]:
    return _convert_indexed(kind, list(enumerate(raw)), row_type, unreadable)


def _convert_indexed(kind: str, raw: list[tuple[int, Any]], row_type: type[T],
                     unreadable: list[UnreadableRow]) -> list[T]:
    rows: list[T] = []
    for index, item in raw:
        try:
            rows.append(msgspec.convert(item, row_type))
        except msgspec.ValidationError as exc:
            row_id = item.get("id") if isinstance(item, dict) else None
            where = _AT_FIELD.search(str(exc))
            unreadable.append(UnreadableRow(
                kind, index, strip_private(row_id) if isinstance(row_id, str) else None,
                where.group(1) if where else None, str(exc)))
    return rows


def _holds_private(body: bytes) -> bool:
    """The egress guard: True when a string of the JSON ``body`` still holds a ``<private``
    opener, judged per string as the redactor judges a field (an escape such as ``\\n`` or
    the string's end can complete an opener). A body that is not UTF-8 counts (fail closed)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return True
    if "<" not in text and "\\u" not in text:
        return False
    try:
        return any(contains_private_marker(_string_decoder.decode(token))
                   for token in (m.group() for m in _JSON_STRING.finditer(text))
                   if "<" in token or "\\u" in token)
    except msgspec.DecodeError:
        return True


def _date_ns(header: str | None) -> int | None:
    if not header:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(header).timestamp()) * 1_000_000_000
    except (TypeError, ValueError, IndexError):
        return None


def _seconds(header: str | None) -> float | None:
    """A positive, finite number of seconds, else None (not offered)."""
    try:
        value = float(header or "")
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def _retry_after(header: str | None) -> float | None:
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(header).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when - time.time())
