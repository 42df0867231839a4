"""``syncd run``: the daemon's lifecycle, explicit and in order.

    (SIGTERM/SIGINT/SIGHUP handled from here on) open store → token → bind → ready → serve →
    stop signal → drain → close

Rules:
  * Nothing is served before the store is open and the socket is bound; ``ready`` fires after.
  * On a stop signal the listener closes first, in-flight requests get ``shutdown_timeout`` to
    finish (aiohttp's runner drains them), then the store closes (its last commit is durable).
  * Exit codes: 0 clean stop, 2 configuration error (a restart will not help), 75 temporary
    failure (data dir in use, port taken — a restart may help).
  * Background work (model warm-up, re-embedding, the embedder's idle unload) is held by
    reference and cancelled on stop.
  * An embedder with ``unload_if_idle`` (MiniLM) is asked by a timer on the loop, at the time it
    names, whether to unload; the call runs on a thread (it stops the model's child process).
    An embedder with ``close`` is closed after the store.
  * The daemon is configured by the ``Config`` it is given (its sections' defaults are the only
    ones); what ``syncd run`` resolves from the flags — the data directory and the address — is
    passed beside it. A configuration that cannot work (a token file missing, a bad pinned key)
    is refused when the daemon is built, before anything is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from local_store import (
    HashingEmbedder,
    Store,
    StoreClosedError,
    StoreLockedError,
    StoreUnusableError,
)
from local_store.embed import Embedder
from local_store.versions import VersionPolicy
from syncd.addresses import is_loopback_host, local_url
from syncd.config import (
    Config,
    EmbeddingConfig,
    EntitlementConfig,
)
from syncd.entitlement.gate import Decision
from syncd.entitlement.keeper import Keeper, attach_gate
from syncd.entitlement.token import pin
from syncd.exits import EXIT_CONFIG, EXIT_OK, EXIT_TEMPFAIL
from syncd.http import create_app
from syncd.notify import notify, watchdog_interval
from syncd.places import default_cache_dir
from syncd.state import state_path
from syncd.sync.engine import SyncOptions
from syncd.sync.runner import SyncRunner, SyncSetupError, read_plane_token
from syncd.token import ensure_token, token_path

CHECKPOINT_SECS = 300  # truncate the WAL every 5 minutes (a long reader may have grown it)
HEARTBEAT_SECS = 1.0  # in-process heartbeat without a service-manager watchdog (launchd)
BLOCKED_WARN_SECS = 5.0  # a heartbeat this late means the event loop was blocked
REEMBED_TICK_SECS = 60.0  # how often the daemon looks whether memories are owed a vector
REEMBED_BACKOFF_CAP_SECS = 1800.0  # while the embedder fails, retries slow down to this
log = logging.getLogger("syncd.daemon")


class StartupError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def make_embedder(embedding: EmbeddingConfig, *, idle_unload: bool) -> Embedder:
    """The ``[embedding]`` section's embedder. ``idle_unload``: MiniLM gives its memory back
    after ``embedding.idle_unload_secs`` unused (the daemon; the hub keeps it loaded). That one
    runs in a child process (``local_store.embed_worker``): stopping the child returns all the
    model took, where an unload in this process left its libraries' pages behind."""
    model, cache_dir, threads = embedding.model, embedding.cache_dir, embedding.threads
    if model == "hashing":
        return HashingEmbedder()
    if model == "all-MiniLM-L6-v2" and idle_unload and embedding.idle_unload_secs > 0:
        from local_store.embed_worker import WorkerEmbedder
        return WorkerEmbedder(intra_op_threads=threads, cache_dir=default_cache_dir(),
                              idle_unload_secs=embedding.idle_unload_secs)
    if model == "all-MiniLM-L6-v2":
        from local_store.embed_minilm import MiniLMEmbedder
        return MiniLMEmbedder(intra_op_threads=threads, cache_dir=default_cache_dir())
    if model == "bge-small-en-v1.5":
        from local_store.embed_minilm import EmbedderUnavailable, FastEmbedBGE
        if cache_dir is None:
            raise StartupError("embedding.cache_dir must name the directory holding the "
                               "bge-small-en-v1.5 files", EXIT_CONFIG)
        try:
            return FastEmbedBGE(cache_dir, threads=threads)
        except EmbedderUnavailable as exc:  # files or package missing: a restart cannot help
            raise StartupError(f"embedding.model = {model!r}: {exc}", EXIT_CONFIG) from None
    raise StartupError(f"embedding.model = {model!r}: unknown model", EXIT_CONFIG)


def check_bind(host: str, allow_non_loopback: bool) -> None:
    """L1: loopback only unless explicitly allowed."""
    if not is_loopback_host(host.strip("[]")) and not allow_non_loopback:
        raise StartupError(
            f"daemon.listen host {host!r} is not a loopback address; the local API must not be "
            "reachable from the network. Set daemon.allow_non_loopback = true (or pass "
            "--allow-non-loopback) only behind your own authentication.", EXIT_CONFIG)


def sync_factory(config: Config) -> Callable[[Store], SyncRunner] | None:
    """The daemon's sync runner, when ``control_plane.url`` is set (its token is read now, so
    a missing token file is a start-up error, not a failing loop)."""
    plane, sync = config.control_plane, config.sync
    url = plane.url
    if not url:
        return None
    try:
        token = read_plane_token(plane.token_file)
    except SyncSetupError as exc:
        raise StartupError(str(exc), EXIT_CONFIG) from None
    options = SyncOptions.from_config(plane, sync)
    return lambda store: SyncRunner.create(store, url=url, token=token, options=options,
                                           interval=sync.interval_secs, jitter=sync.jitter,
                                           token_file=plane.token_file, proxy=plane.proxy,
                                           plane_embedder=plane_embedder(config))


def plane_embedder(config: Config) -> Callable[[], Embedder] | None:
    """What builds an embedder of the plane's model, for memories a Kyma plane would otherwise
    get without a vector it can rank (``syncd.sync.staged.Prepare.plane_vectors``): bge-small-en-v1.5 from
    the files already under ``embedding.cache_dir`` (never downloaded). None for another model."""
    from local_store.embed_minilm import BGE_MODEL_ID, EmbedderUnavailable, FastEmbedBGE
    if config.control_plane.embedding_model != BGE_MODEL_ID:
        return None
    cache_dir = config.embedding.cache_dir

    def build() -> Embedder:
        if cache_dir is None:
            raise EmbedderUnavailable(f"{BGE_MODEL_ID} is unavailable: embedding.cache_dir is "
                                      "not set (the directory that holds its files)")
        return FastEmbedBGE(cache_dir, threads=config.embedding.threads)
    return build


def pinned_keys(entitlement: EntitlementConfig) -> dict[str, Ed25519PublicKey]:
    """``entitlement.public_keys``, parsed; a bad one is a configuration error."""
    try:
        return pin(entitlement.public_keys)
    except ValueError as exc:
        raise StartupError(str(exc), EXIT_CONFIG) from None


class Daemon:
    def __init__(self, config: Config, *, data_dir: Path, host: str, port: int,
                 embedder: Embedder, reembed_tick: float = REEMBED_TICK_SECS) -> None:
        """``data_dir``, ``host`` and ``port``: where ``syncd run`` resolved them (its flags
        over ``daemon.data_dir`` and ``daemon.listen``); everything else is ``config``'s."""
        # absolute: status and the logs show where the store is, whatever the cwd was
        self.data_dir, self.host, self.port = data_dir.absolute(), host, port
        self.config, self.embedder, self.reembed_tick = config, embedder, reembed_tick
        self.shutdown_timeout = config.daemon.shutdown_timeout_secs
        self.sync_factory = sync_factory(config)
        self.pinned = pinned_keys(config.entitlement)
        self.versions = VersionPolicy(config.versions.keep, config.versions.max_age_days)
        self.url = ""
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._background: set[asyncio.Task[Any]] = set()

    def stop(self, why: str = "asked to") -> None:
        """Stop serving; ``why`` goes in the log's "stopping" line (the first one given)."""
        if not self._stop.is_set():
            self._stop_reason = why
        self._stop.set()

    async def run(self, ready: Callable[[str], None] | None = None) -> int:
        with stop_signals(self.stop):
            return await self._run(ready)

    async def _run(self, ready: Callable[[str], None] | None) -> int:
        check_bind(self.host, self.config.daemon.allow_non_loopback)
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, listing, self.data_dir)
        served = False
        try:
            store = await Store.open(self.data_dir, embedder=self.embedder,
                                     versions=self.versions)
        except StoreLockedError as exc:
            raise StartupError(str(exc), EXIT_TEMPFAIL) from None
        except StoreUnusableError as exc:  # restarting cannot fix the file
            raise StartupError(str(exc), EXIT_CONFIG) from None
        runner: web.AppRunner | None = None
        sync: SyncRunner | None = None
        keeper: Keeper | None = None
        try:
            try:
                token = await asyncio.get_running_loop().run_in_executor(
                    None, ensure_token, self.data_dir)
            except OSError as exc:  # e.g. a directory where the file should be
                raise StartupError(f"cannot use the API token file {token_path(self.data_dir)}: "
                                   f"{exc.strerror or exc}", EXIT_CONFIG) from None
            sync = self.sync_factory(store) if self.sync_factory is not None else None
            keeper = self._gate(store, sync)
            daemon = self.config.daemon
            app = create_app(store, token=token, extra_hosts=tuple(daemon.allowed_hosts),
                             max_body=daemon.max_body_bytes,
                             plane_model=self.config.control_plane.embedding_model, sync=sync,
                             keeper=keeper,
                             stop=lambda: self.stop("asked over HTTP: `syncd stop` or the page"))
            runner = web.AppRunner(app, shutdown_timeout=self.shutdown_timeout,
                                   access_log=None, handle_signals=False)
            await runner.setup()
            await self._bind(runner)
            served = True
            await self._write_state(runner.addresses[0][1])
            self._start_background(store)
            await keeper.start()
            decision = keeper.gate.decision
            log.info("entitlement: %s", entitlement_summary(decision))
            if sync is not None:
                await sync.start()
                log.info("syncing with %s every %.0f s", sync.engine.client.url, sync.interval)
            log.info("syncd serving %s (data dir %s)", self.url, self.data_dir)
            if ready is not None:
                ready(self.url)
            notify(f"READY=1\nSTATUS=serving {self.url}")
            await self._stop.wait()
            notify("STOPPING=1")
            log.info("stopping (%s): draining requests (up to %.0f s)", self._stop_reason,
                     self.shutdown_timeout)
            return EXIT_OK
        finally:
            await self._drain(runner, sync, keeper)
            for task in self._background:
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            with contextlib.suppress(OSError):
                await asyncio.get_running_loop().run_in_executor(
                    None, state_path(self.data_dir).unlink)
            await store.close()
            if isinstance(self.embedder, Closing):  # after the store: no embed can follow
                await loop.run_in_executor(None, self.embedder.close)
            if not served:  # a failed start leaves the data dir as it found it
                await loop.run_in_executor(None, restore_listing, self.data_dir, found)

    async def _drain(self, runner: web.AppRunner | None, sync: SyncRunner | None,
                     keeper: Keeper | None) -> None:
        """The listener closes first (the runner stops its sites before it drains), then
        in-flight requests and a sync pass in flight share one ``shutdown_timeout``: they are
        waited for side by side, so a pass stalled on the plane cannot stretch the stop. The
        keeper's stop starts ahead of the others (it marks the keeper stopped before its first
        wait): a request waiting on it must not fetch with the plane client sync's stop closes."""
        closing = []
        if keeper is not None:
            closing.append(keeper.stop())
        if runner is not None:
            closing.append(runner.cleanup())
        if sync is not None:
            closing.append(sync.stop(grace=self.shutdown_timeout))
        for failure in await asyncio.gather(*closing, return_exceptions=True):
            if isinstance(failure, Exception):
                log.error("stopping: %s", failure, exc_info=failure)

    def _gate(self, store: Store, sync: SyncRunner | None) -> Keeper:
        return attach_gate(store, sync, self.data_dir, self.pinned, self.config.entitlement)

    async def _bind(self, runner: web.AppRunner) -> None:
        self.url = await listen(runner, self.host, self.port, self.shutdown_timeout)
        unix_socket = self.config.daemon.unix_socket
        if unix_socket is not None:
            try:
                await web.UnixSite(runner, str(unix_socket)).start()
            except OSError as exc:
                raise StartupError(f"cannot listen on {unix_socket}: {exc.strerror or exc}",
                                   EXIT_TEMPFAIL) from None

    async def _write_state(self, port: int) -> None:
        # The URL clients on this machine use: a wildcard bind (0.0.0.0, ::) over loopback,
        # whose Host the guard accepts (``self.url``, what is bound, would be refused: 421).
        state = {"pid": os.getpid(), "url": local_url(self.host.strip("[]"), port)}

        def write() -> None:
            path = state_path(self.data_dir)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(state, handle)

        await asyncio.get_running_loop().run_in_executor(None, write)

    def _start_background(self, store: Store) -> None:
        async def warm_and_reembed() -> None:
            try:
                await store.recall.query({"query": "warm up", "limit": 1})
            except Exception:  # background work must never take the daemon down
                log.exception("background warm-up failed")
            await reembed_while_owed(store, self.reembed_tick)

        async def checkpoint_periodically() -> None:
            while True:
                await asyncio.sleep(CHECKPOINT_SECS)
                try:  # versions past the age bound go even where nothing is written
                    await store.versions.prune()
                except Exception:
                    log.exception("pruning old versions failed")
                try:
                    await store.maintenance.checkpoint()
                except Exception:
                    log.exception("WAL checkpoint failed")

        async def heartbeat() -> None:
            """``WATCHDOG=1`` at half systemd's interval, from the loop itself (a blocked loop
            misses it and gets restarted); always a warning when the loop was blocked."""
            watchdog = watchdog_interval()
            interval = watchdog / 2 if watchdog else HEARTBEAT_SECS
            while True:
                started = time.monotonic()
                await asyncio.sleep(interval)
                late = time.monotonic() - started - interval
                if late > BLOCKED_WARN_SECS:
                    log.warning("event loop was blocked for %.1f s", late)
                if watchdog:
                    notify("WATCHDOG=1")

        jobs = [("warm-up", warm_and_reembed()), ("checkpoint", checkpoint_periodically()),
                ("heartbeat", heartbeat())]
        if isinstance(self.embedder, IdleUnloading):
            jobs.append(("embedder-unload", unload_when_idle(self.embedder)))
        for name, work in jobs:
            task = asyncio.create_task(work, name=name)
            self._background.add(task)
            task.add_done_callback(self._background.discard)


@runtime_checkable
class Closing(Protocol):
    def close(self) -> None:
        """Stop what the embedder runs (its child process); the daemon's last step."""
        ...


@runtime_checkable
class IdleUnloading(Protocol):
    def unload_if_idle(self) -> float:
        """Unload when idle long enough; the seconds after which to ask again (inf: never)."""
        ...


async def unload_when_idle(embedder: IdleUnloading) -> None:
    """Ask the embedder whether to unload at the time its last answer named, until it says
    never (``embedding.idle_unload_secs = 0``). Unused for 10 minutes, that is one call per 10
    minutes; a failing call is logged and asked again a minute later."""
    while True:
        try:
            wait = await asyncio.to_thread(embedder.unload_if_idle)
        except Exception:  # background work must never take the daemon down
            log.exception("unloading the idle embedder failed")
            wait = 60.0
        if math.isinf(wait):
            return
        await asyncio.sleep(max(wait, 0.01))


async def reembed_while_owed(store: Store, tick: float = REEMBED_TICK_SECS,
                             cap: float = REEMBED_BACKOFF_CAP_SECS) -> None:
    """Give memories a vector of the local model whenever the store owes some
    (``Store.vectors_owed``: saved while the embedder failed, or applied with another model's
    vector or none), without waiting for a pull or a restart. Looks every ``tick`` seconds;
    while the embedder fails, retries back off from ``tick`` to ``cap`` — but a save that
    finds the embedder working again (``embedder_error`` cleared) brings the next pass to the
    next tick. The store logs the embedder's failure when it changes; this loop adds nothing
    to the log for it."""
    loop = asyncio.get_running_loop()
    wait, next_try = tick, 0.0
    while True:
        if store.vectors_owed and (store.embedder_error is None or loop.time() >= next_try):
            try:
                count = await store.embedding.reembed_missing(progress=ProgressLog(
                    f"re-embedding with {store.embedder.model_id}"))
                if count:
                    log.info("re-embedded %d memories with %s", count, store.embedder.model_id)
                wait = tick
            except StoreClosedError:
                return
            except Exception:  # background work must never take the daemon down
                wait = min(wait * 2, cap)
                log.debug("re-embedding failed; next try in %.0f s", wait, exc_info=True)
            next_try = loop.time() + wait
        await asyncio.sleep(tick)


def listing(directory: Path) -> frozenset[str] | None:
    """The names in ``directory``, None when it does not exist."""
    try:
        return frozenset(os.listdir(directory))
    except FileNotFoundError:
        return None


def restore_listing(directory: Path, found: frozenset[str] | None) -> None:
    """Remove what a failed start made in ``directory`` (the store it opened, its token): the
    entries not in ``found``, or the directory itself when it did not exist. Only a start that
    opened the store calls this: it held the store's lock, so nothing else wrote there."""
    if found is None:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for name in set(os.listdir(directory)) - found:
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


async def listen(runner: web.AppRunner, host: str, port: int, shutdown_timeout: float) -> str:
    """Bind ``host:port`` (port 0: any free one) and return the URL it serves on; a bind
    failure is a temporary failure (exit 75)."""
    bare = host.strip("[]")
    try:
        await web.TCPSite(runner, bare, port, shutdown_timeout=shutdown_timeout).start()
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           EXIT_TEMPFAIL) from None
    shown = f"[{bare}]" if ":" in bare else host
    return f"http://{shown}:{runner.addresses[0][1]}"


class ProgressLog:
    """``progress(done, total)`` for long background work: one INFO line at most every
    ``every`` seconds (re-embedding 10k memories with MiniLM takes minutes)."""

    def __init__(self, what: str, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.every, self._clock = what, every, clock
        self._last = clock()

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if now - self._last >= self.every and done < total:
            self._last = now
            log.info("%s: %d of %d memories", self.what, done, total)


# SIGHUP too: the terminal of a foreground `syncd run` closing stops it cleanly, as SIGTERM
# does, instead of killing it with its state file left behind.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals(stop: Callable[[str], None]) -> Iterator[None]:
    """The ``STOP_SIGNALS`` call ``stop`` while this lasts — set up before any start-up work, so
    a signal that comes during start-up, or just after "ready", is a clean stop once start-up
    is done (installed only after "ready", a SIGTERM within ~10 ms of it killed the process)."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop, f"{sig.name} received")
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(sig)


def report(message: str) -> None:
    print(f"syncd: {message}", file=sys.stderr, flush=True)


def entitlement_summary(decision: Decision) -> str:
    """The start-up log's entitlement line, its expiry as a date a person reads."""
    if not decision.entitled:
        return f"paid features paused ({decision.reason})"
    if decision.exp is None:
        return "sync and graph on"
    until = datetime.datetime.fromtimestamp(decision.exp, datetime.UTC)
    return f"sync and graph on until {until:%Y-%m-%d %H:%M:%S} UTC"
