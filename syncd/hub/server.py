"""``syncd hub``: run the reference control plane — open store (with the change feed) →
tokens → bind → serve → (SIGTERM/SIGINT) → drain → close. Exit codes as the daemon's:
0 clean stop, 2 configuration error, 75 temporary failure (data dir in use, port taken).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from local_store import Store, StoreLockedError
from local_store.embed import Embedder
from syncd.daemon import EXIT_CONFIG, EXIT_OK, EXIT_TEMPFAIL, StartupError, listen, wait_for_stop
from syncd.hub.app import create_hub_app
from syncd.hub.keys import KeyFileError, load_or_create_key
from syncd.hub.tokens import TokenBook, TokenFileError, list_tokens
from syncd.notify import notify, watchdog_interval

log = logging.getLogger("syncd.hub")
REEMBED_SECS = 30.0


class Hub:
    def __init__(self, *, data_dir: Path, host: str, port: int, embedder: Embedder,
                 cursor: str = "ingest", shutdown_timeout: float = 10.0,
                 token_lifetime_days: float = 7.0) -> None:
        self.data_dir, self.host, self.port = data_dir, host, port
        self.token_lifetime_days = token_lifetime_days
        self.embedder, self.cursor, self.shutdown_timeout = embedder, cursor, shutdown_timeout
        self.url = ""
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, ready: Callable[[str], None] | None = None) -> int:
        try:
            store = await Store.open(self.data_dir, embedder=self.embedder, feed=True)
        except StoreLockedError as exc:
            raise StartupError(str(exc), EXIT_TEMPFAIL) from None
        runner: web.AppRunner | None = None
        try:
            loop = asyncio.get_running_loop()
            try:
                book = await loop.run_in_executor(None, TokenBook, self.data_dir)
                active = [t for t in await loop.run_in_executor(None, list_tokens, self.data_dir)
                          if not t["revoked_at"]]
                key = await loop.run_in_executor(None, load_or_create_key, self.data_dir)
            except (TokenFileError, KeyFileError) as exc:
                raise StartupError(str(exc), EXIT_CONFIG) from None
            if not active:
                log.warning("no hub tokens yet: create one with `syncd hub token create "
                            "--data-dir %s --role write --name laptop`", self.data_dir)
            app = create_hub_app(store, book, cursor=self.cursor, signing_key=key,
                                 token_lifetime_days=self.token_lifetime_days)
            runner = web.AppRunner(app, shutdown_timeout=self.shutdown_timeout,
                                   access_log=None, handle_signals=False)
            await runner.setup()
            self.url = await listen(runner, self.host, self.port, self.shutdown_timeout)
            log.info("syncd hub serving %s (cursor %s, store %s, model %s)", self.url,
                     self.cursor, store.store_id, self.embedder.model_id)
            if ready is not None:
                ready(self.url)
            notify(f"READY=1\nSTATUS=serving {self.url}")
            tasks = [asyncio.create_task(self._watchdog(), name="watchdog"),
                     asyncio.create_task(self._reembed(store), name="reembed")]
            try:
                await self._wait_for_stop()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            notify("STOPPING=1")
            return EXIT_OK
        finally:
            if runner is not None:
                await runner.cleanup()
            await store.close()

    async def _watchdog(self) -> None:
        """``WATCHDOG=1`` at half systemd's interval, from the event loop itself."""
        interval = watchdog_interval()
        while interval:
            await asyncio.sleep(interval / 2)
            notify("WATCHDOG=1")

    async def _reembed(self, store: Store) -> None:
        """Rows pushed by laptops on another model arrive with zero vectors: embed them with
        the hub's model, so the hub's semantic recall covers them."""
        while True:
            try:
                count = await store.reembed_missing()
                if count:
                    log.info("embedded %d memories with %s", count, store.embedder.model_id)
            except Exception:  # background work must never take the hub down
                log.exception("re-embedding failed")
            await asyncio.sleep(REEMBED_SECS)

    async def _wait_for_stop(self) -> None:
        await wait_for_stop(self._stop, self.stop)
