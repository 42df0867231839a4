"""A small synchronous client of the local API for the CLI (stdlib only, no event loop).

Errors are ``ClientError`` with a message a person can act on; "the daemon is not running" is
its own subclass so callers can choose to be silent (hooks) or loud (CLI).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from syncd.state import read_state
from syncd.token import read_token, token_path


class ClientError(Exception):
    pass


class DaemonDown(ClientError):
    pass


@dataclass(frozen=True)
class Client:
    url: str
    token: str
    timeout: float = 30.0

    @classmethod
    def for_data_dir(cls, data_dir: Path, listen_url: str, timeout: float = 30.0) -> Client:
        """The running daemon's URL (from its state file) or the configured one, and the token."""
        state = read_state(data_dir) or {}
        url = str(state.get("url") or listen_url)
        try:
            token = read_token(token_path(data_dir))
        except (OSError, ValueError) as exc:
            raise DaemonDown(str(exc)) from None
        return cls(url.rstrip("/"), token, timeout)

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ClientError(_error_text(exc.code, exc.read())) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise DaemonDown(f"syncd daemon is not running at {self.url} "
                             f"({getattr(exc, 'reason', exc)}); start it with `syncd run`") from None
        return json.loads(raw) if raw else None


    def download(self, path: str, sink: IO[bytes]) -> dict[str, str]:
        """GET ``path``, copying the body into ``sink`` as it arrives (1 MiB at a time);
        returns the answer's headers. A body cut short is a ``ClientError`` (``sink`` then
        holds a part: write it somewhere you can discard)."""
        request = urllib.request.Request(self.url + path, method="GET",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            resp = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise ClientError(_error_text(exc.code, exc.read())) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise DaemonDown(f"syncd daemon is not running at {self.url} "
                             f"({getattr(exc, 'reason', exc)}); start it with `syncd run`") from None
        with resp:
            while True:
                try:
                    chunk = resp.read(DOWNLOAD_CHUNK)
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    raise ClientError(f"the daemon's answer to GET {path} was cut short "
                                      f"({type(exc).__name__}); its log says why") from None
                if not chunk:
                    return dict(resp.headers)
                sink.write(chunk)  # its errors (a closed pipe, a full disk) are the caller's


DOWNLOAD_CHUNK = 1 << 20


def _error_text(status: int, raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        field = f" (field {error['field']})" if error.get("field") else ""
        return f"{status} {error['code']}: {error['message']}{field}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {raw[:200].decode(errors='replace')}"
