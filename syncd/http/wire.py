"""How the HTTP handlers of the daemon and the hub decode requests and encode answers: strict
JSON bodies, typed bodies, import bodies, and the plane's rows streamed a page at a time.

Rules:
  * A body is UTF-8 JSON (RFC 8259), strictly: no ``NaN``/``Infinity``, no lone surrogate
    escape; anything else is a 400 ``bad_json``. A body that does not fit its type is a 422
    naming the field.
  * A streamed answer cannot become an error answer once it has begun: a failure then drops
    the connection (``streamed``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from local_store import ValidationError
from local_store.apply import ApplyResult
from local_store.arguments import msgspec_field
from local_store.exporting import ExportPages
from local_store.redact import holds_lone_surrogate
from protocol.rows import EXPORT_COUNT_HEADERS, ImportRequest, ImportResult, RowError
from syncd.http.errors import BadJson

log = logging.getLogger("syncd.http")
EXPORT_HINT = ("Re-import on another instance via POST /v1/agent/memory/import with this same "
               "{memory_nodes, memory_edges} body.")
_encoder = msgspec.json.Encoder()


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise BadJson("request body is empty; send a JSON object")
    try:  # UTF-8 only (RFC 8259), strictly: no surrogate can arrive as raw bytes
        value = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except RecursionError:
        raise BadJson("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise BadJson(f"malformed JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) and holds_lone_surrogate(value):
        raise BadJson("malformed JSON: a lone surrogate escape "
                      "(\\ud800-\\udfff without its pair) is not text")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(name: str) -> Any:
    """Python's ``json`` reads ``NaN`` and ``Infinity``; JSON has neither."""
    raise ValueError(f"{name} is not a JSON value")


async def read_typed(request: web.Request, kind: type[Any]) -> Any:
    return _typed(await read_json(request), kind)


def _typed(body: Any, kind: type[Any]) -> Any:
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise ValidationError(msgspec_field(str(exc)), str(exc)) from None


IMPORT_FIELDS = ("memory_nodes", "memory_edges")


async def read_import(request: web.Request) -> ImportRequest:
    """An import body, which must hold ``memory_nodes`` or ``memory_edges`` (or both): an
    object with neither (the wrong file, a misspelt key) would apply nothing and answer 200.
    The daemon and the hub refuse it alike; Kyma's plane takes it (contract §4.4), but no
    syncd client sends one (the push names both lists, ``syncd import`` refuses such a file)."""
    body = await read_json(request)
    if isinstance(body, dict) and not any(name in body for name in IMPORT_FIELDS):
        raise ValidationError(", ".join(IMPORT_FIELDS),
                              "the body holds neither memory_nodes nor memory_edges: give "
                              "either list of rows, or both")
    result: ImportRequest = _typed(body, ImportRequest)
    return result


def json_object(body: Any) -> dict[str, Any]:
    """``body`` when it is a JSON object, else a 422 naming ``body``."""
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    return body


def reply(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(value), status=status,
                        content_type="application/json")



async def stream_text(request: web.Request, pieces: AsyncIterator[str],
                      headers: Mapping[str, str]) -> web.StreamResponse:
    """A text body streamed a piece at a time (``streamed``'s rules)."""
    async def body(response: web.StreamResponse) -> None:
        async for piece in pieces:
            await response.write(piece.encode())
    return await streamed(request, headers, body)


async def stream_rows(request: web.Request, snapshot: ExportPages, *,
                      head: Mapping[str, object] | None = None,
                      tail: Callable[[], Mapping[str, object]]) -> web.StreamResponse:
    """A body of the plane's rows (export, ``changes``), streamed a page at a time, so memory
    stays bounded by a page whatever the store's size: ``head``'s members, ``memory_nodes``,
    ``memory_edges``, then ``tail()``'s members (called once the rows are out, so an ``until``
    there is read after them). ``X-Syncd-Memories``/``X-Syncd-Edges`` give the counts up
    front."""
    memories, edges = EXPORT_COUNT_HEADERS

    async def body(response: web.StreamResponse) -> None:
        opening = b"{" + b"".join(_member(k, v) + b"," for k, v in (head or {}).items())
        await _write_array(response, opening + b'"memory_nodes":[', snapshot.node_pages())
        await _write_array(response, b'],"memory_edges":[', snapshot.edge_pages())
        await response.write(b"]" + b"".join(b"," + _member(k, v) for k, v in tail().items())
                             + b"}")
    return await streamed(request, {"Content-Type": "application/json",
                                    memories: str(snapshot.memories),
                                    edges: str(snapshot.edges)}, body)


async def streamed(request: web.Request, headers: Mapping[str, str],
                   body: Callable[[web.StreamResponse], Awaitable[None]]) -> web.StreamResponse:
    """An answer whose ``body`` writes it as it goes. A failure once the body has begun cannot
    become an error answer: the connection is dropped, so the client sees a truncated body,
    never a short complete-looking one."""
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    try:
        await body(response)
    except ConnectionError:  # the client hung up (aiohttp's ClientConnectionResetError too)
        log.debug("the client went away during a streamed answer")
        return response
    except Exception:
        log.exception("a streamed answer failed after it began; dropping the connection")
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response


def _member(key: str, value: object) -> bytes:
    return _encoder.encode(key) + b":" + _encoder.encode(value)


async def _write_array(response: web.StreamResponse, opening: bytes,
                       pages: AsyncIterator[Sequence[Any]]) -> None:
    """``opening`` then the pages' rows, comma-separated (the array's closing bracket is the
    caller's, with what follows it)."""
    separator = b""
    await response.write(opening)
    async for page in pages:
        if page:
            await response.write(separator + b",".join(_encoder.encode(row) for row in page))
            separator = b","



def import_result(result: ApplyResult) -> ImportResult:
    """The plane's import answer, with syncd's per-row errors (``row_errors``)."""
    problems = [RowError(kind=p.kind, index=p.index, id=p.id, field=p.field, message=p.message)
                for p in result.problems]
    return ImportResult(
        applied_nodes=result.applied_nodes, applied_edges=result.applied_edges,
        errors=[f"{p.kind}s[{p.index}].{p.field}: {p.message}" for p in problems],
        row_errors=problems or None)
