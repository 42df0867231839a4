"""The MCP server: JSON-RPC 2.0 over any transport (``POST /mcp/v1``, or stdio through the bridge).

``McpServer.handle`` takes one decoded JSON value (a request object or a batch list) and returns
the value to send back, or ``None`` when there is nothing to send (only notifications).

Rules:
  * A request (a message with an ``id``) always gets exactly one response; a notification (no
    ``id``) never gets one. A malformed message gets an ``Invalid Request`` error with id null;
    so does a request whose id is null (MCP, unlike base JSON-RPC: "the ID MUST NOT be null").
  * Tool failures the agent caused (bad arguments, unknown ids) are tool *results* with
    ``isError: true`` and the one error shape ``{"error": {"code", "message", "field"}}`` as
    text, so the agent reads them; an unknown tool name is a JSON-RPC -32602.
  * Argument values are never logged: they may hold text meant to stay private. Names the
    client chose (argument keys, a method or tool name) pass the redactor before they reach a
    log line or an error message.
  * The tools are the ``Surfacer``'s table (the daemon's ``TOOLS``, the hub's ``HUB_TOOLS``).
    A transport that serves callers of the ``read`` role (the hub, whose MCP needs only
    ``read`` as the plane's does) sets ``CALLER_CAN_WRITE`` to False for the request: then
    ``tools/list`` holds only ``READ_ONLY_TOOLS`` and calling another tool is a -32602 naming
    the tool and the role it needs, with nothing run. Unset, every tool is served (the
    daemon's one token is its owner's).
  * Built without a store (``McpServer(None, …)``), it is the stdio bridge's local half: it
    answers ``initialize``, ``tools/list``, ``ping`` and every malformed message exactly as the
    daemon would, from the same table, so an agent never starts toolless; ``tools/call`` is
    the daemon's (the bridge forwards it, and reports a daemon it cannot reach with
    ``unavailable``, a tool error naming the fix).
  * A body is read as JSON whatever decoder it takes: valid JSON msgspec refuses (a number
    beyond double range, an escaped lone surrogate) is read by the stdlib, as the stdio bridge
    and the REST routes read it, so the request keeps its id; an answer msgspec cannot encode
    goes out with ASCII escapes, as it came in.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final

import msgspec

import syncd
from local_store import Store, StoreError, ValidationError
from local_store.redact import strip_private
from syncd.tools import READ_ONLY_TOOLS, Surfacer, Tool

log = logging.getLogger(__name__)

JSONRPC: Final = "2.0"
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

# Newest first; an ``initialize`` asking for one of these gets it echoed, anything else the first.
SUPPORTED_PROTOCOL_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_PROTOCOL_VERSION: Final = SUPPORTED_PROTOCOL_VERSIONS[0]

INSTRUCTIONS: Final = (
    "syncd is your long-term memory across sessions and machines. "
    "At the start of every task, call memory_search (or recall_memory) with the task in a few "
    "words, and pass memoryContext (the current task, entities, constraints) on later calls so "
    "relevant memories keep surfacing; pass back the conversationId you are given. "
    "Save what a future session should know: decisions and why (save_memory, memory_type "
    "'decision'), learnings and gotchas (record_learning), preferences, procedures; use "
    "topic_key to update a memory in place instead of adding a copy, and verify_memory before "
    "saving when unsure whether it is already known. Give a memory that belongs to one "
    "project realm = the project's directory name, and leave realm out for what holds "
    "everywhere (the prompt hook recalls the project's realm, 'global' and 'default'). "
    "End a long session with "
    "memory_session_summary. Never store secrets (tokens, passwords, keys, personal data) "
    "except inside <private>…</private>, which is redacted before anything is written."
)

CALLER_CAN_WRITE: ContextVar[bool] = ContextVar("syncd_mcp_caller_can_write", default=True)
_DESTRUCTIVE: Final = frozenset({"delete_memory", "memory_judge", "update_memory_status"})
_IDEMPOTENT: Final = frozenset({"update_memory_status", "update_memory_importance",
                                "ingest_entity", "memory_note", "delete_memory"})


class _ProtocolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_response(request_id: object, code: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error response."""
    return {"jsonrpc": JSONRPC, "id": request_id, "error": {"code": code, "message": message}}


def _tool_entry(tool: Tool) -> dict[str, Any]:
    name = tool.name
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.schema,
        "annotations": {
            "readOnlyHint": name in READ_ONLY_TOOLS,
            "destructiveHint": name in _DESTRUCTIVE,
            "idempotentHint": name in READ_ONLY_TOOLS or name in _IDEMPOTENT,
            "openWorldHint": False,
        },
    }


def _tool_error(code: str, message: str, field: str | None) -> dict[str, Any]:
    body = {"error": {"code": code, "message": message, "field": field}}
    return {"content": [{"type": "text", "text": msgspec.json.encode(body).decode()}],
            "structuredContent": body, "isError": True}


def _valid_id(value: object) -> bool:
    """A string or a number that can be echoed as it came (not 1e400, read as infinity). Never
    null: MCP requires an id a client can match its answer to."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int) and not isinstance(value, bool)


def _shown(name: str, limit: int = 80) -> str:
    """A client-chosen name fit for a message or a log line: redacted, then shortened."""
    return strip_private(name)[:limit]


def decode_message(body: bytes) -> object:
    """The JSON value in ``body``: msgspec first, then the stdlib for valid JSON msgspec refuses.
    Raises ``ValueError`` for a body that is not JSON (``NaN``, ``Infinity`` and text that is
    not UTF-8 included), ``RecursionError`` for one nested too deeply for either decoder."""
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        pass
    return json.loads(body.decode("utf-8"), parse_constant=_not_json)


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def encode_message(value: object) -> bytes:
    """``value`` as JSON. Text UTF-8 cannot carry (a lone surrogate, which JSON can spell as
    ``"\\ud800"``, say in an id) goes out as JSON escapes; encoding never fails."""
    try:
        return msgspec.json.encode(value)
    except UnicodeEncodeError:
        pass
    try:
        return json.dumps(value, ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode("ascii")
    except ValueError:  # a non-finite number beside the surrogate: no faithful JSON exists
        return msgspec.json.encode(error_response(None, INTERNAL_ERROR, "Internal error: the "
                                                  "answer cannot be written as JSON"))


class McpServer:
    """Stateless JSON-RPC dispatcher over the tool table; the ``Surfacer`` holds conversations."""

    def __init__(self, store: Store | None, surfacer: Surfacer, *, server_name: str = "syncd",
                 version: str = syncd.__version__,
                 check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """``check``: called on a tool call's arguments before the tool runs; a
        ``ValidationError`` it raises is the call's tool error (what a backend cannot store)."""
        self.store = store
        self.check = check
        self.surfacer = surfacer
        self.server_name = server_name
        self.version = version
        entries = [_tool_entry(tool) for tool in surfacer.tools.values()]
        self._tools_list = {"tools": entries}
        self._read_tools_list = {"tools": [e for e in entries if e["name"] in READ_ONLY_TOOLS]}

    def unavailable(self, request_id: object, message: str) -> dict[str, Any]:
        """The answer to a ``tools/call`` no daemon could run: a tool error the agent reads,
        ``message`` naming the fix."""
        return {"jsonrpc": JSONRPC, "id": request_id,
                "result": _tool_error("daemon_unavailable", message, None)}

    async def handle(self, payload: object) -> object | None:
        """Answer one decoded JSON-RPC message or batch; ``None`` means send nothing."""
        if isinstance(payload, list):
            if not payload:
                return error_response(None, INVALID_REQUEST, "Invalid Request: empty batch")
            answers = [await self._handle_one(message) for message in payload]
            replies = [a for a in answers if a is not None]
            return replies or None
        return await self._handle_one(payload)

    async def handle_bytes(self, body: bytes) -> bytes | None:
        """``handle`` on a raw body: a body that is not JSON, or nested too deeply to read, gets
        a -32700 Parse error."""
        answer: object | None
        try:
            payload = decode_message(body)
        except RecursionError:
            answer = error_response(None, PARSE_ERROR, "Parse error: JSON nested too deeply")
        except ValueError:
            answer = error_response(None, PARSE_ERROR, "Parse error: not JSON")
        else:
            answer = await self.handle(payload)
        return None if answer is None else encode_message(answer)

    # ------------------------------------------------------------------ dispatch

    async def _handle_one(self, message: object) -> dict[str, Any] | None:
        if not isinstance(message, dict):
            return error_response(None, INVALID_REQUEST,
                                  "Invalid Request: a message must be a JSON object")
        if "method" not in message and ("result" in message or "error" in message):
            return None  # a response to a server request; this server sends none, so ignore it
        has_id = "id" in message
        request_id = message.get("id")
        if has_id and not _valid_id(request_id):
            return error_response(None, INVALID_REQUEST,
                                  "Invalid Request: id must be a string or a number")
        reply_id = request_id if has_id else None
        if message.get("jsonrpc") != JSONRPC:
            return error_response(reply_id, INVALID_REQUEST,
                                  'Invalid Request: "jsonrpc" must be "2.0"')
        method = message.get("method")
        if not isinstance(method, str) or not method:
            return error_response(reply_id, INVALID_REQUEST,
                                  'Invalid Request: "method" must be a non-empty string')
        params = message.get("params")
        try:
            if params is not None and not isinstance(params, dict):
                raise _ProtocolError(INVALID_PARAMS, "Invalid params: params must be an object")
            result = await self._dispatch(method, params or {}, notification=not has_id)
        except _ProtocolError as exc:
            return error_response(request_id, exc.code, exc.message) if has_id else None
        except Exception:
            log.exception("MCP method %s failed", _shown(method))
            return error_response(request_id, INTERNAL_ERROR,
                                  "Internal error") if has_id else None
        if not has_id:
            return None
        return {"jsonrpc": JSONRPC, "id": request_id, "result": result}

    async def _dispatch(self, method: str, params: dict[str, Any], *,
                        notification: bool) -> dict[str, Any]:
        if method == "tools/call":
            return await self._call_tool(params)
        if method == "tools/list":
            return self._tools_list if CALLER_CAN_WRITE.get() else self._read_tools_list
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        if notification and method.startswith("notifications/"):
            return {}  # initialized, cancelled, roots/list_changed…: nothing to do
        raise _ProtocolError(METHOD_NOT_FOUND, f"Method not found: {_shown(method)}")

    def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        version = asked if asked in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": self.server_name, "version": self.version},
            "instructions": INSTRUCTIONS,
        }

    async def _call_tool(self, params: Mapping[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str):
            raise _ProtocolError(INVALID_PARAMS, 'Invalid params: "name" must be a string')
        if name not in self.surfacer.tools:
            raise _ProtocolError(INVALID_PARAMS, f"Unknown tool: {_shown(name)!r}; "
                                 "call tools/list for the tool names")
        if name not in READ_ONLY_TOOLS and not CALLER_CAN_WRITE.get():
            raise _ProtocolError(INVALID_PARAMS, f"Tool {name!r} needs the write role; this "
                                 "token has the read role, which may call only the tools "
                                 "tools/list shows it")
        if self.store is None:  # the bridge forwards tools/call; reaching here is a bug
            raise _ProtocolError(INTERNAL_ERROR, "Internal error: no store to run tools on")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return _tool_error("invalid", "must be a JSON object", "arguments")
        try:
            if self.check is not None:
                self.check(arguments)
            result = await self.surfacer.call(self.store, name, arguments)
        except ValidationError as exc:
            return _tool_error(exc.code, exc.message, exc.field)
        except StoreError as exc:  # not found, store closed…
            return _tool_error(exc.code, exc.message, getattr(exc, "field", None))
        except Exception as exc:
            # Keys only, redacted: the values may carry private text, and so may a key.
            log.exception("tool %s failed (argument keys: %s)", name,
                          ", ".join(sorted(_shown(str(k), 40) for k in arguments)[:20]))
            return _tool_error("internal", f"internal error in {name} "
                               f"({type(exc).__name__}); see the daemon log", None)
        value = msgspec.to_builtins(result)
        out: dict[str, Any] = {
            "content": [{"type": "text", "text": msgspec.json.encode(value).decode()}],
            "isError": False,
        }
        if isinstance(value, dict):
            out["structuredContent"] = value
        return out
