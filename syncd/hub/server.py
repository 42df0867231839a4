"""``syncd hub``: run the reference control plane — open the hub store (SQLite with its change
feed, or PostgreSQL) → tokens → bind → serve → (SIGTERM/SIGINT/SIGHUP) → drain → close. Exit codes as
the daemon's: 0 clean stop, 2 configuration error, 75 temporary failure (data dir in use,
database unreachable, port taken).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from local_store import Store, StoreLockedError, StoreUnusableError
from local_store.embed import Embedder
from syncd.config import DEFAULT_SHUTDOWN_TIMEOUT_SECS, HubConfig
from syncd.daemon import StartupError, listen, stop_signals
from syncd.exits import EXIT_CONFIG, EXIT_OK, EXIT_TEMPFAIL
from syncd.hub.app import create_hub_app
from syncd.hub.keys import KeyFileError
from syncd.hub.store import FileTokens, HubStore, SqliteHubStore, StoreUnavailableError
from syncd.hub.tokens import TokenFileError
from syncd.notify import notify, watchdog_interval

log = logging.getLogger("syncd.hub")


class Hub:
    def __init__(self, *, data_dir: Path, host: str, port: int, embedder: Embedder,
                 config: HubConfig | None = None,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_SECS,
                 dsn: str | None = None) -> None:
        """``config``: the ``[hub]`` section (its defaults when None); ``data_dir`` and ``dsn``
        as the command line resolved them: ``dsn`` (``postgresql://…``) puts the hub on
        PostgreSQL, else SQLite in ``data_dir``."""
        self.data_dir, self.host, self.port, self.dsn = data_dir, host, port, dsn
        self.config = config or HubConfig()
        self.cursor, self.reembed_secs = self.config.cursor, self.config.reembed_secs
        self.embedder, self.shutdown_timeout = embedder, shutdown_timeout
        self.url = ""
        self._stop = asyncio.Event()

    def stop(self, why: str = "asked to") -> None:
        if not self._stop.is_set():
            log.info("stopping (%s)", why)
        self._stop.set()

    async def run(self, ready: Callable[[str], None] | None = None) -> int:
        with stop_signals(self.stop):
            return await self._run(ready)

    async def _run(self, ready: Callable[[str], None] | None) -> int:
        backend = await self._open()
        runner: web.AppRunner | None = None
        try:
            try:
                active = [t for t in await backend.tokens.list() if not t["revoked_at"]]
                key = await backend.signing_key()
            except (TokenFileError, KeyFileError) as exc:
                raise StartupError(str(exc), EXIT_CONFIG) from None
            except StoreUnavailableError as exc:
                raise StartupError(str(exc), EXIT_TEMPFAIL) from None
            if not active:
                where = "--store-file FILE" if self.dsn else f"--data-dir {self.data_dir}"
                log.warning("no hub tokens yet: create one with `syncd hub token create "
                            "%s --role write --name laptop`", where)
            app = create_hub_app(backend, config=self.config, signing_key=key)
            runner = web.AppRunner(app, shutdown_timeout=self.shutdown_timeout,
                                   access_log=None, handle_signals=False)
            await runner.setup()
            self.url = await listen(runner, self.host, self.port, self.shutdown_timeout)
            log.info("syncd hub serving %s (store %s %s, cursor %s, model %s)", self.url,
                     backend.kind, backend.store_id, self.cursor, self.embedder.model_id)
            if ready is not None:
                ready(self.url)
            notify(f"READY=1\nSTATUS=serving {self.url}")
            tasks = [asyncio.create_task(self._watchdog(), name="watchdog")]
            if self.reembed_secs > 0:
                tasks.append(asyncio.create_task(self._reembed(backend), name="reembed"))
            try:
                await self._stop.wait()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            notify("STOPPING=1")
            return EXIT_OK
        finally:
            if runner is not None:
                await runner.cleanup()
            await backend.close()

    async def _open(self) -> HubStore:
        if self.dsn is not None:
            from syncd.hub.pg import PgHubStore
            from syncd.hub.pg.migrate import SchemaError
            try:
                return await PgHubStore.open(self.dsn, embedder=self.embedder)
            except StoreUnavailableError as exc:
                raise StartupError(str(exc), EXIT_TEMPFAIL) from None
            except SchemaError as exc:
                raise StartupError(str(exc), EXIT_CONFIG) from None
        try:
            store = await Store.open(self.data_dir, embedder=self.embedder, feed=True)
        except StoreLockedError as exc:
            raise StartupError(str(exc), EXIT_TEMPFAIL) from None
        except StoreUnusableError as exc:
            raise StartupError(str(exc), EXIT_CONFIG) from None
        return SqliteHubStore(store, FileTokens(self.data_dir))

    async def _watchdog(self) -> None:
        """``WATCHDOG=1`` at half systemd's interval, from the event loop itself."""
        interval = watchdog_interval()
        while interval:
            await asyncio.sleep(interval / 2)
            notify("WATCHDOG=1")

    async def _reembed(self, store: HubStore) -> None:
        """Rows pushed by laptops on another model arrive with zero vectors: embed them with
        the hub's model, so the hub's semantic recall covers them."""
        failing: str | None = None  # the last failure, logged once until it changes
        while True:
            try:
                count = await store.reembed_missing()
                if count:
                    log.info("embedded %d memories with %s", count, store.embedder.model_id)
                failing = None
            except Exception as exc:  # background work must never take the hub down
                error = f"{type(exc).__name__}: {exc}"
                if error != failing:
                    log.exception("re-embedding failed (logged again when the error changes)")
                failing = error
            await asyncio.sleep(self.reembed_secs)

