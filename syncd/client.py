"""A small synchronous client of the local API for the CLI (stdlib only, no event loop).

Errors are ``ClientError`` with a message a person can act on, on one line; "the daemon is not
running" is its own subclass so callers can choose to be silent (hooks) or loud (CLI). Another
program on the daemon's port (something that is not HTTP, or HTTP that does not answer in
syncd's JSON) counts as the daemon not running there. A request that got no answer in
``timeout`` is not: the daemon took it and may still be working on it. Nor is a connection
that timed out: most often a listening socket was there and its process did not take it.

It never goes through a proxy, whatever ``http_proxy``, ``all_proxy`` or ``no_proxy`` say: the
daemon is on this machine, and a proxy would be sent the API token and the prompt. So every
request goes through ``_OPENER``, never ``urllib.request.urlopen`` (which reads those).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from syncd.state import read_state, state_path
from syncd.token import read_token, token_path

# An empty ProxyHandler: no proxy, and no proxy variable read (the default opener reads them).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClientError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status of a daemon's error answer, else None


class DaemonDown(ClientError):
    pass


@dataclass(frozen=True)
class Client:
    url: str
    token: str
    timeout: float = 30.0
    # Where ``url`` came from and how to start a daemon there, for "not running" (a phrase:
    # "the address is daemon.listen in /x/config.toml; start it with `syncd run --config …`").
    down_hint: str = "start it with `syncd run`"

    @classmethod
    def for_data_dir(cls, data_dir: Path, listen_url: str, timeout: float = 30.0, *,
                     listen_source: str = "", start: str = "syncd run") -> Client:
        """The running daemon's URL (from its state file) or the configured one, and the token.
        ``listen_source`` says what set ``listen_url`` ("--listen", "daemon.listen in FILE",
        …) and ``start`` the command that starts a daemon on this data dir."""
        state = read_state(data_dir) or {}
        url = str(state.get("url") or listen_url)
        if state.get("url"):
            where = (f"the address is the one a daemon recorded in {state_path(data_dir)} "
                     "(it did not stop cleanly)")
        else:
            where = f"the address is {listen_source}" if listen_source else ""
        hint = f"{where}; start it with `{start}`" if where else f"start it with `{start}`"
        try:
            token = read_token(token_path(data_dir))
        except (OSError, ValueError) as exc:
            raise DaemonDown(str(exc)) from None
        return cls(url.rstrip("/"), token, timeout, hint)

    def call(self, method: str, path: str, body: object = None) -> Any:
        try:  # JSON has no Infinity or NaN: never send Python's spelling of them
            data = None if body is None else json.dumps(body, allow_nan=False).encode()
        except ValueError as exc:
            raise ClientError(f"cannot send {method} {path}: {exc}") from None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._error(exc.code, exc.read()) from None
        except TimeoutError:  # not wrapped in URLError: sent, but no answer in time
            raise self._timed_out(method, path) from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise self._down(exc) from None
        except http.client.HTTPException as exc:  # not HTTP at all (an SSH server, …)
            raise self._not_syncd(type(exc).__name__) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # HTTP, but not syncd's (a web page, …)
            raise self._not_syncd("its answer is not JSON") from None

    def download(self, path: str, sink: IO[bytes],
                 expect: str = "application/json") -> dict[str, str]:
        """GET ``path``, copying the body (of media type ``expect``) into ``sink`` as it
        arrives (1 MiB at a time); returns the answer's headers. A body cut short is a
        ``ClientError`` (``sink`` then holds a part: write it somewhere you can discard)."""
        request = urllib.request.Request(self.url + path, method="GET",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            resp = _OPENER.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise self._error(exc.code, exc.read()) from None
        except TimeoutError:
            raise self._timed_out("GET", path) from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise self._down(exc) from None
        except http.client.HTTPException as exc:
            raise self._not_syncd(type(exc).__name__) from None
        with resp:
            if resp.headers.get_content_type() != expect:
                raise self._not_syncd(f"its answer is {resp.headers.get_content_type()}, not "
                                      f"{expect}")
            while True:
                try:
                    chunk = resp.read(DOWNLOAD_CHUNK)
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    raise ClientError(f"the daemon's answer to GET {path} was cut short "
                                      f"({type(exc).__name__}); its log says why") from None
                if not chunk:
                    return dict(resp.headers)
                sink.write(chunk)  # its errors (a closed pipe, a full disk) are the caller's

    def _error(self, status: int, raw: bytes) -> ClientError:
        """The daemon's error answer (its one JSON shape), or, for any other body, another
        program answering on the daemon's port."""
        try:
            error = json.loads(raw)["error"]
            field = f" (field {error['field']})" if error.get("field") else ""
            return ClientError(f"{status} {error['code']}: {error['message']}{field}", status)
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._not_syncd(f"HTTP {status}, not a syncd error answer")

    def _down(self, exc: Exception) -> ClientError:
        """Nothing listens (refused, reset): not running. A connection that timed out most
        often reached a listening socket that no process took it from in time — a daemon
        stopped (SIGSTOP) or swamped, whose lock a second one started would only find taken —
        or, for an address off this machine, nothing answered at all."""
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            return ClientError(f"the daemon at {self.url} did not take the request within "
                               f"{self.timeout:g} s; it may be stopped, overloaded or out of "
                               "reach: its log says why (a second one cannot start while it "
                               "holds the data dir)")
        return DaemonDown(f"syncd daemon is not running at {self.url} ({_in_words(reason)}); "
                          f"{self.down_hint}")

    def _timed_out(self, method: str, path: str) -> ClientError:
        """urllib wraps a failure to connect or send in ``URLError`` (the daemon is down); a
        bare timeout came after the request was sent, so the daemon is up and may still be
        working on it: saying "not running" would send the person to start a second one."""
        return ClientError(f"the daemon at {self.url} did not answer {method} {path} within "
                           f"{self.timeout:g} s; it is still running and may still be working "
                           "on the request: `syncd status` shows how it went")

    def _not_syncd(self, what: str) -> DaemonDown:
        return DaemonDown(f"{self.url} does not answer like a syncd daemon ({what}): another "
                          "program may be using that port; check daemon.listen and `syncd run`")


DOWNLOAD_CHUNK = 1 << 20


def _in_words(reason: object) -> str:
    """A failure to connect as a person says it: "connection refused", not "[Errno 111]
    Connection refused"."""
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror[:1].lower() + reason.strerror[1:]
    return str(reason)
