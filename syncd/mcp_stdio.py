"""``syncd mcp``: the MCP stdio bridge a coding agent launches; it forwards to the running daemon.

Each newline-delimited JSON-RPC message read from stdin is POSTed to ``{url}/mcp/v1`` (bearer
token, one reused connection, in order); each answer is written to stdout as one line of JSON.

Rules:
  * stdout carries JSON-RPC messages and nothing else; diagnostics go to stderr.
  * It never crashes on what it reads or on the daemon: when the daemon is down or refuses, each
    request (a message with an ``id``) gets a -32000 error naming the cause and the fix (a tool
    error, with a ``local`` server: below), and the bridge keeps going. Notifications get no
    answer, ever.
  * Without a ``local`` server (the bare forwarder, ``python -m syncd.mcp_stdio``),
    ``initialize`` waits up to ``INITIALIZE_WAIT`` seconds for a daemon that is not up yet (or
    has not written its token yet): an agent started at login, or while the daemon restarts,
    would otherwise fail its handshake and go without memory tools for the whole session.
    Other requests fail at once.
  * Exit 0 at stdin EOF.
  * With a ``local`` server (what ``syncd mcp`` runs, ``serve_mcp``) everything but
    ``tools/call`` is answered here, from the tool table, whether or not a daemon runs:
    ``initialize`` and ``tools/list`` answer at once, so an agent never starts toolless.
    ``tools/call`` is forwarded; one the daemon cannot answer is a tool error (``isError``)
    naming the cause and the fix. With a ``starter`` (``[mcp] autostart``, syncd/autostart.py)
    a daemon is started as the bridge starts and whenever a call finds none, and the call
    waits for it. The daemon's URL is read again from its state file before every call.
  * This module imports neither the store nor the tool table (``serve_mcp`` does, when it
    runs): ``python -m syncd.mcp_stdio`` is the bare forwarder.
  * It never goes through a proxy (``trust_env=False``, whatever ``http_proxy`` says): the
    daemon is on this machine, and a proxy would be sent the token and every tool call.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final, Protocol

import aiohttp

log = logging.getLogger("syncd.mcp_stdio")

DEFAULT_URL: Final = "http://127.0.0.1:7777"
DEFAULT_TIMEOUT: Final = 120.0
CONNECT_TIMEOUT: Final = 5.0
INITIALIZE_WAIT: Final = 20.0  # under the 30–60 s MCP clients give a server to initialize
_RETRY_EVERY: Final = 0.5
MCP_PATH: Final = "/mcp/v1"
DAEMON_ERROR: Final = -32000
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
_READ_AHEAD: Final = 64



class TokenSource(Protocol):
    """Gives the API token (``None``: none yet); ``refresh`` re-reads it after a refusal."""

    def __call__(self, *, refresh: bool = False) -> str | None: ...


class LocalServer(Protocol):
    """Answers what needs no daemon: ``syncd.mcp.McpServer`` built without a store."""

    async def handle(self, payload: object) -> object | None: ...

    def unavailable(self, request_id: object, message: str) -> dict[str, Any]: ...


class Starter(Protocol):
    """Starts a daemon when none answers (syncd/autostart.py)."""

    def begin(self) -> None:
        """Start one in the background if none answers (the bridge calls it as it starts)."""

    async def ensure(self) -> str | None:
        """``None`` once a daemon answers, else the message for the agent, naming the fix."""


class _DaemonError(Exception):
    """The daemon could not answer; ``message`` is what the agent is told. ``absent``: it is
    not up (nothing listens, or no token yet), so it may be starting."""

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.absent = absent


def not_running_message(url: str) -> str:
    return f"syncd daemon is not running at {url} — start it with `syncd run`"


def token_from_file(path: str | os.PathLike[str]) -> TokenSource:
    """A token source that reads ``path`` until it succeeds (the daemon writes it on first start),
    and again after the daemon refuses it (the token may have been rotated)."""
    cache: list[str] = []
    said: list[str] = []  # the last failure logged: a waiting ``initialize`` re-reads often

    def read(*, refresh: bool = False) -> str | None:
        if cache and not refresh:
            return cache[0]
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            problem = f"cannot read the token file {path}: {exc.strerror or exc}"
            if said != [problem]:
                log.warning("%s", problem)
                said[:] = [problem]
            return cache[0] if cache else None
        said.clear()
        cache[:] = [token] if token else []
        return token or None

    return read


def _request_ids(payload: object) -> list[object]:
    """The ids of the requests in a message or batch (notifications have none); one JSON cannot
    carry back (1e400, read as infinity) is null, as the daemon answers it."""
    messages = payload if isinstance(payload, list) else [payload]
    ids = [m.get("id") for m in messages if isinstance(m, dict) and "id" in m and "method" in m]
    return [None if isinstance(i, float) and not math.isfinite(i) else i for i in ids]


def _errors_for(payload: object, code: int, message: str) -> object | None:
    """Error answers for every request in ``payload``; ``None`` if it holds only notifications."""
    errors = [{"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
              for request_id in _request_ids(payload)]
    if not errors:
        return None
    return errors if isinstance(payload, list) else errors[0]


def _is_call(message: object) -> bool:
    return isinstance(message, dict) and message.get("method") == "tools/call"


def _opens_session(payload: object) -> bool:
    messages = payload if isinstance(payload, list) else [payload]
    return any(isinstance(m, dict) and m.get("method") == "initialize" and "id" in m
               for m in messages)


def _read_json(data: bytes | str) -> object:
    """JSON as the daemon reads it (``syncd.mcp.decode_message``): ``NaN`` and ``Infinity``
    are not JSON, and an id spelled so would be echoed into a line that is not JSON either."""
    return json.loads(data, parse_constant=_not_json)


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _encode_line(value: object) -> bytes:
    """One line of JSON. Text that UTF-8 cannot carry (a lone surrogate, which ``json`` reads
    from ``"\\ud800"`` in an id) goes out as JSON escapes, as it came in. A number JSON cannot
    spell (infinity) raises ``ValueError``: stdout carries JSON and nothing else."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode("ascii")
    return text + b"\n"


class _Bridge:
    def __init__(self, url: str, token: TokenSource, session: aiohttp.ClientSession,
                 initialize_wait: float = INITIALIZE_WAIT, local: LocalServer | None = None,
                 starter: Starter | None = None,
                 resolve: Callable[[], str] | None = None) -> None:
        self.resolve = resolve
        self._point_at(url)
        self.token = token
        self.session = session
        self.initialize_wait = initialize_wait
        self.local = local
        self.starter = starter

    def _point_at(self, url: str) -> None:
        self.base = url.rstrip("/")
        self.endpoint = self.base + MCP_PATH

    async def answer(self, line: bytes) -> object | None:
        """The answer to one stdin line (``None``: nothing to write)."""
        if self.local is None:
            return await self.forward(line)
        try:
            payload = _read_json(line)
        except (ValueError, RecursionError):
            return await self.forward(line)  # the parse errors, as the bare bridge words them
        messages = payload if isinstance(payload, list) else [payload]
        calls = [m for m in messages if _is_call(m)]
        if not calls:
            return await self.local.handle(payload)
        if not isinstance(payload, list):
            return await self._call(line, payload)
        # A batch's answers may come in any order (JSON-RPC 2.0 §6): local ones, then the calls'.
        answers = [await self.local.handle(m) for m in messages if not _is_call(m)]
        called = await self._call(_encode_line(calls), calls)
        answers += called if isinstance(called, list) else [called]
        return [a for a in answers if a is not None] or None

    async def _call(self, body: bytes, payload: object) -> object | None:
        """``tools/call`` (one, or a batch of them) answered by the daemon — started first if
        none answers and there is a starter — or tool errors naming why it could not be."""
        starter = self.starter
        try:
            return await self._post_fresh(body, payload)
        except _DaemonError as exc:
            if not exc.absent or starter is None:
                return self._unavailable(payload, exc.message)
        problem = await starter.ensure()
        if problem is not None:
            return self._unavailable(payload, problem)
        try:
            return await self._post_fresh(body, payload)
        except _DaemonError as exc:
            return self._unavailable(payload, exc.message)

    async def _post_fresh(self, body: bytes, payload: object) -> object | None:
        if self.resolve is not None:  # the daemon may have moved (port 0, a restart)
            self._point_at(await asyncio.to_thread(self.resolve))
        return await self._post(body, payload)

    def _unavailable(self, payload: object, message: str) -> object | None:
        assert self.local is not None
        log.warning("%s", message)
        failed = [self.local.unavailable(i, message) for i in _request_ids(payload)]
        if not failed:
            return None
        return failed if isinstance(payload, list) else failed[0]

    async def forward(self, line: bytes) -> object | None:
        """The daemon's answer to one stdin line (``None``: nothing to write)."""
        try:
            payload = _read_json(line)
        except RecursionError:  # too deep to read, here as in the daemon
            return {"jsonrpc": "2.0", "id": None,
                    "error": {"code": PARSE_ERROR, "message": "Parse error: JSON nested too "
                              "deeply"}}
        except ValueError:  # includes UnicodeDecodeError
            return {"jsonrpc": "2.0", "id": None,
                    "error": {"code": PARSE_ERROR, "message": "Parse error: not JSON"}}
        if payload == []:
            return {"jsonrpc": "2.0", "id": None,
                    "error": {"code": INVALID_REQUEST, "message": "Invalid Request: empty batch"}}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.initialize_wait if _opens_session(payload) else 0.0)
        waiting = False
        while True:
            try:
                return await self._post(line, payload)
            except _DaemonError as exc:
                left = deadline - loop.time()
                if not exc.absent or left <= 0:
                    log.warning("%s", exc.message)
                    return _errors_for(payload, DAEMON_ERROR, exc.message)
                if not waiting:
                    log.warning("%s; waiting up to %.0f s for it to start",
                                exc.message, self.initialize_wait)
                    waiting = True
                await asyncio.sleep(min(_RETRY_EVERY, left))

    async def _post(self, body: bytes, payload: object) -> object | None:
        token = await asyncio.to_thread(self.token)  # a file read: off the loop
        if token is None:
            raise _DaemonError(f"syncd daemon is not running at {self.base}: there is no API "
                               "token yet (no readable token file) — start the daemon with "
                               "`syncd run`; it creates the token", absent=True)
        status, text = await self._send(body, token)
        if status == 401:
            fresh = await asyncio.to_thread(self.token, refresh=True)
            if fresh and fresh != token:
                status, text = await self._send(body, fresh)
        if status in (202, 204) or (200 <= status < 300 and not text.strip()):
            return None
        if 200 <= status < 300:
            try:
                answer: object = _read_json(text)
            except ValueError:
                raise _DaemonError(f"syncd daemon at {self.base} sent a reply that is not "
                                   "JSON") from None
            return answer
        raise _DaemonError(self._refusal(status, text))

    async def _send(self, body: bytes, token: str) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        for attempt in (1, 2):
            try:
                async with self.session.post(self.endpoint, data=body, headers=headers) as resp:
                    return resp.status, await resp.text(errors="replace")
            except aiohttp.ServerDisconnectedError:
                # A kept-alive connection the daemon closed (it restarted): retry once, fresh.
                if attempt == 2:
                    raise _DaemonError(f"syncd daemon at {self.base} closed the connection "
                                       "without answering") from None
            except aiohttp.ConnectionTimeoutError:
                raise _DaemonError(not_running_message(self.base), absent=True) from None
            except TimeoutError:
                raise _DaemonError(f"syncd daemon at {self.base} did not answer in time"
                                   ) from None
            except (aiohttp.ClientConnectionError, OSError):
                raise _DaemonError(not_running_message(self.base), absent=True) from None
        raise AssertionError("unreachable")

    def _refusal(self, status: int, text: str) -> str:
        detail = text.strip()[:300]
        try:
            body = json.loads(text)
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                detail = str(body["error"].get("message") or detail)[:300]
        except ValueError:
            pass
        if status in (401, 403):
            return (f"syncd daemon at {self.base} refused the API token (HTTP {status}: "
                    f"{detail}) — check the token file")
        return f"syncd daemon at {self.base} answered HTTP {status}: {detail}"


def _pump(source: IO[bytes], queue: asyncio.Queue[bytes | None],
          loop: asyncio.AbstractEventLoop) -> None:
    """Reader thread: stdin lines into ``queue`` (bounded), then ``None`` at EOF."""
    try:
        while True:
            try:
                line = source.readline()
            except (OSError, ValueError) as exc:
                log.warning("reading stdin failed: %s", exc)
                line = b""
            if isinstance(line, str):  # a text stream was given
                line = line.encode("utf-8")
            item = line or None
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            if item is None:
                return
    except (RuntimeError, concurrent.futures.CancelledError):
        return  # the loop is gone: the bridge has stopped


async def run_stdio_bridge(url: str | Callable[[], str], token: str | TokenSource, *,
                           stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                           request_timeout: float = DEFAULT_TIMEOUT,
                           initialize_wait: float = INITIALIZE_WAIT,
                           local: LocalServer | None = None,
                           starter: Starter | None = None) -> int:
    """Forward newline-delimited JSON-RPC from ``stdin`` to the daemon at ``url`` (or the URL
    it returns, read again before each ``tools/call``); answers to ``stdout``. Returns the
    exit code (0 at stdin EOF)."""
    source = stdin if stdin is not None else sys.stdin.buffer
    sink = stdout if stdout is not None else sys.stdout.buffer
    tokens = _fixed(token) if isinstance(token, str) else token
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_READ_AHEAD)
    # A daemon thread, not the executor: a read blocked on a silent stdin must not hold up exit.
    threading.Thread(target=_pump, args=(source, queue, loop), name="syncd-mcp-stdin",
                     daemon=True).start()
    client_timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=CONNECT_TIMEOUT)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(timeout=client_timeout, connector=connector,
                                     trust_env=False) as session:
        resolve = None if isinstance(url, str) else url
        first = url if isinstance(url, str) else await asyncio.to_thread(url)
        bridge = _Bridge(first, tokens, session, initialize_wait, local, starter, resolve)
        if starter is not None:
            starter.begin()
        while (line := await queue.get()) is not None:
            if not line.strip():
                continue
            try:
                answer = await bridge.answer(line)
                data = None if answer is None else _encode_line(answer)
            except Exception:  # never crash: a bug here costs one message, not the session
                log.exception("forwarding a message failed")
                answer = _errors_for(_safe_json(line), DAEMON_ERROR,
                                     "syncd mcp bridge failed on this message; see its stderr")
                data = None if answer is None else _encode_line(answer)
            if data is None:
                continue
            try:
                await asyncio.to_thread(_write, sink, data)
            except (OSError, ValueError) as exc:
                log.warning("stdout is closed (%s); stopping", exc)
                return 0
    return 0


def _fixed(token: str) -> TokenSource:
    def read(*, refresh: bool = False) -> str | None:
        return token or None
    return read


def _safe_json(line: bytes) -> object:
    """``line`` decoded, or ``None``: called from the handler that must not fail itself."""
    try:
        return _read_json(line)
    except (ValueError, RecursionError):
        return None


def _write(sink: IO[bytes], data: bytes) -> None:
    sink.write(data)
    sink.flush()


def serve_mcp(*, data_dir: Path, listen_url: str, config: Path | None, autostart: bool,
              start_timeout: float) -> int:
    """``syncd mcp``: the tool table served here, tool calls forwarded to the daemon of
    ``data_dir`` — started when none answers, if ``autostart`` (then a call waits up to
    ``start_timeout`` seconds for it)."""
    from syncd.autostart import DaemonStarter, daemon_url
    from syncd.mcp import McpServer
    from syncd.service import default_platform
    from syncd.token import token_path
    from syncd.tools import Surfacer

    async def serve() -> int:
        starter = DaemonStarter(config=config, data_dir=data_dir, listen_url=listen_url,
                                timeout=start_timeout,
                                platform=default_platform()) if autostart else None
        try:
            return await run_stdio_bridge(lambda: daemon_url(data_dir, listen_url),
                                          token_from_file(token_path(data_dir)),
                                          local=McpServer(None, Surfacer()), starter=starter)
        finally:
            if starter is not None:
                await starter.close()

    try:
        return asyncio.run(serve())
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncd mcp", description="MCP over stdio, forwarded to the running syncd daemon.")
    parser.add_argument("--url", default=os.environ.get("SYNCD_URL", DEFAULT_URL),
                        help=f"the daemon's base URL (default {DEFAULT_URL})")
    parser.add_argument("--token-file", required=True, help="the daemon's api-token file")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds to wait for one answer")
    parser.add_argument("--initialize-wait", type=float, default=INITIALIZE_WAIT,
                        help="seconds `initialize` waits for a daemon that is not up yet "
                             f"(default {INITIALIZE_WAIT:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="syncd mcp: %(levelname)s %(message)s")
    try:
        return asyncio.run(run_stdio_bridge(args.url, token_from_file(args.token_file),
                                            request_timeout=args.timeout,
                                            initialize_wait=args.initialize_wait))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
