"""The prompt hook, ``syncd recall --hook``: Claude Code's ``UserPromptSubmit`` and
``SessionStart`` hooks (``session_query``: a session starts with the project's memories).

stdin ``{"prompt", "session_id", "cwd", …}``, stdout ``{"hookSpecificOutput": {"hookEventName",
"additionalContext"}}``. It recalls in the project's realm (the basename of ``cwd``), ``global``
and ``default`` — where a memory saved without a realm lands, as agents' saves over MCP usually
are — and asks for the confident tier only (``confident_only``): a memory that may not answer
the prompt is not context, so an off-topic prompt ("continue", "thanks") prints nothing.

Rules:
  * Never in the agent's way: a down daemon, a missing token, bad input, a bad config or any
    other error prints nothing, exit 0.
  * It runs on every prompt, so it imports only cheap standard modules (``json``, ``socket``;
    ``tomllib`` when a config file is there to read whose answer is not kept) and syncd's stdlib-only ``places``,
    ``hook_config``, ``state`` and ``token`` — never aiohttp, msgspec, numpy, the store, ``argparse`` or
    ``urllib.request`` (``syncd.entry`` dispatches here before any of them). ``syncd.cli``
    runs this same code for ``recall --hook``.
  * The daemon's data directory and URL are found exactly as every other command finds them
    (``syncd.commands.settings.command_settings``): the config file, ``SYNCD_*``, then
    ``--data-dir``. A usual config is read by ``syncd.hook_config`` (``tomllib``, the options
    it can vouch for), which keeps its answer in the user's cache
    (``syncd.places.default_cache_dir``) for the next prompts and sessions until the file or
    the environment changes; an unusual one is decided by ``syncd.config.load_config`` itself — slower (msgspec), never
    different.
  * One HTTP/1.1 request on a plain socket, as ``syncd.client`` sends it (the same headers
    that matter, the state file's URL, a 1 s timeout on connecting and on each read) and never
    through a proxy; a URL that is not plain ``http://host:port`` goes through
    ``syncd.client`` instead.
"""

from __future__ import annotations

import json
import os
import re  # urllib.parse imports it already
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import SplitResult, urlsplit  # pathlib imports it already

from syncd.hook_config import fast_address
from syncd.state import read_state
from syncd.token import read_token, token_path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy reads it
if TYPE_CHECKING:
    from typing import Any

HOOK_TIMEOUT_SECS = 1.0
QUERY_PATH = "/v1/agent/memory/query"


# "this project", "our repo", "the codebase", "this app": words that point at the project the
# agent works in (its cwd) rather than naming it.
PROJECT_POINTER = re.compile(
    r"\b(?:(?:this|our|the|current)\s+(?:project|repo|repository|codebase|code\s+base)"
    r"|this\s+(?:app|application|service))\b(?!-)", re.IGNORECASE)  # "the repo-list" names

SESSION_START = "SessionStart"
SESSION_LIMIT = 8  # memories a session starts with
SESSION_BUDGET_CHARS = 4000  # the context a session starts with, cut at a line
# The daemon's heading when no memory matched (``local_store.ranking.FALLBACK_HEADING``, which
# this module must not import): a session has no query, so it is said in its own words.
FALLBACK_HEADING = "No memory matched the query. The most important recent memories:\n"


def run_hook(config: Path | None, data_dir: Path | None) -> int:
    """The whole hook; ``config`` and ``data_dir`` are the ``--config``/``--data-dir`` flags."""
    try:
        payload = json.loads(sys.stdin.read())
        if not isinstance(payload, dict):
            return 0
        cwd = payload.get("cwd")
        project = Path(cwd if isinstance(cwd, str) and cwd else Path.cwd()).name
        realms = list(dict.fromkeys(name for name in (project, "global", "default") if name))
        event = payload.get("hook_event_name")
        if event == SESSION_START:
            body: dict[str, Any] = session_query(project, realms)
        else:
            prompt = payload.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                return 0
            event, body = "UserPromptSubmit", {"query": named_project(prompt, project),
                                               "realms": realms,
                                               "confident_only": True}
        where, listen_url = daemon_address(config, data_dir, os.environ)
        result = _query(where, listen_url, body)
        if not isinstance(result, dict) or not result.get("memories"):
            return 0
        context = result.get("context")
        if event == SESSION_START and isinstance(context, str):
            context = within_budget(session_heading(context, project), SESSION_BUDGET_CHARS)
        if isinstance(context, str) and context.strip():
            print(json.dumps({"hookSpecificOutput": {"hookEventName": event,
                                                     "additionalContext": context}}))
    except Exception:  # the hook must never break the agent's prompt
        return 0
    return 0


def named_project(prompt: str, project: str) -> str:
    """``prompt`` with each pointer at the project ("this repo") replaced by its name."""
    return PROJECT_POINTER.sub(project, prompt) if project else prompt


def session_query(project: str, realms: list[str]) -> dict[str, Any]:
    """What a session starts with (Claude Code's ``SessionStart``: startup, resume, clear,
    compact): the explicit tier of a recall for the project's name in its realms, so the
    memories that name it come first, the confident ones before the others; when none
    matches, the daemon answers with the most important recent ones (its fallback), so a
    session never starts on an empty slate."""
    return {"query": project or "project", "realms": realms, "limit": SESSION_LIMIT,
            "expand_hops": 0}


def session_heading(context: str, project: str) -> str:
    """A session's context says what it is: the daemon's "no memory matched the query" means,
    at a session's start, that no memory names the project yet."""
    if not context.startswith(FALLBACK_HEADING):
        return context
    named = f"this project ({project})" if project else "this project"
    return (f"No memory names {named} yet. The most important recent memories:\n"
            + context[len(FALLBACK_HEADING):])


def within_budget(context: str, budget: int) -> str:
    """``context`` cut after the last whole line that fits in ``budget`` characters."""
    if len(context) <= budget:
        return context
    cut = context.rfind("\n", 0, budget)
    return context[:cut + 1] if cut > 0 else context[:budget]


def daemon_address(config: Path | None, data_dir: Path | None,
                   env: Mapping[str, str]) -> tuple[Path, str]:
    """(data directory, configured URL), as ``syncd.commands.settings.command_settings``
    finds them for ``recall``; raises what it raises (``ConfigError``, ``OSError``) for a
    config it refuses."""
    found = fast_address(config, env)
    if found is None:  # an unusual config: only load_config can say
        from syncd.addresses import local_url, parse_listen
        from syncd.config import load_config
        loaded = load_config(config, dict(env))
        found = loaded.daemon.data_dir, local_url(*parse_listen(loaded.daemon.listen))
    where, listen_url = found
    return (data_dir.expanduser() if data_dir else Path(where)), listen_url


def _query(data_dir: Path, listen_url: str, body: dict[str, Any]) -> Any:
    """POST the query as ``syncd.client.Client.for_data_dir(…).call`` would: the running
    daemon's URL from its state file, else the configured one; a failure raises."""
    url = str((read_state(data_dir) or {}).get("url") or listen_url).rstrip("/")
    token = read_token(token_path(data_dir))
    data = json.dumps(body, allow_nan=False).encode()
    parts = urlsplit(url + QUERY_PATH)
    if parts.scheme != "http" or "@" in parts.netloc or parts.fragment or not parts.hostname:
        from syncd.client import Client
        return Client(url, token, HOOK_TIMEOUT_SECS).call("POST", QUERY_PATH, body)
    status, raw = _post(parts, token, data)
    if not 200 <= status < 300:
        raise ConnectionError(f"HTTP {status}")
    return json.loads(raw) if raw else None


def _post(parts: SplitResult, token: str, data: bytes) -> tuple[int, bytes]:
    """One request with ``Connection: close``; (status, body)."""
    if any(c in token for c in "\r\n"):
        raise ValueError("the token holds a line break")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    head = (f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept-Encoding: identity\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode("latin-1")
    host = parts.hostname or ""
    # bytes: a str host is IDNA-encoded first, whose codec imports unicodedata
    address = (host.encode("ascii") if host.isascii() else host, parts.port or 80)
    # typeshed says str, getaddrinfo takes bytes too
    with socket.create_connection(address, timeout=HOOK_TIMEOUT_SECS) as sock:  # type: ignore[arg-type]
        sock.sendall(head + data)
        return _read_response(sock)


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of an HTTP/1.1 answer: read to its Content-Length, or to the end."""
    raw, length, start, status = b"", None, -1, 0
    headers: dict[bytes, bytes] = {}
    while length is None or len(raw) - start < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        raw += chunk
        if start < 0 and (end := raw.find(b"\r\n\r\n")) >= 0:
            start = end + 4
            status, headers = _parse_head(raw[:end])
            if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                length = None  # to the end (Connection: close), then de-chunked
            elif b"content-length" in headers:
                length = int(headers[b"content-length"])
    if start < 0:
        raise ConnectionError("no HTTP answer")
    body = raw[start:]
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return status, _dechunk(body)
    if length is not None and len(body) < length:
        raise ConnectionError("the answer was cut short")
    return status, body if length is None else body[:length]


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    status = rest[:3]
    if not version.startswith(b"HTTP/1.") or not status.isdigit():
        raise ConnectionError("not HTTP")
    fields = (line.partition(b":") for line in lines[1:])
    return int(status), {name.strip().lower(): value.strip() for name, _, value in fields}


def _dechunk(body: bytes) -> bytes:
    out, at = b"", 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return out
        out += body[line_end + 2:line_end + 2 + size]
        at = line_end + 2 + size + 2
