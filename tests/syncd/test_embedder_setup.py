"""The embedder as the daemon and the hub set it up and run it: a model that cannot load is a
configuration error (exit 2, not "try again"), the hub's periodic re-embedding reports a
failure that does not change once, not every period, and the daemon gives memories their
vector once its embedder works again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from local_store import HashingEmbedder, Store
from protocol.rows import NodeRow
from syncd.config import EmbeddingConfig, HubConfig
from syncd.daemon import StartupError, make_embedder, reembed_while_owed
from syncd.exits import EXIT_CONFIG
from syncd.hub.server import Hub
from syncd.hub.store import SqliteHubStore


def test_bge_without_its_files_is_a_configuration_error(tmp_path: Path) -> None:
    """``embedding.model = "bge-small-en-v1.5"`` with a cache_dir that lacks the files (or no
    fastembed): the loader's error escaped, so `syncd run` exited 75 ("try again") with a
    traceback, and `syncd hub` died with an uncaught one. Retrying never helps."""
    with pytest.raises(StartupError) as caught:
        make_embedder(EmbeddingConfig(model="bge-small-en-v1.5",
                                      cache_dir=tmp_path / "empty-cache"), idle_unload=True)
    assert caught.value.exit_code == EXIT_CONFIG
    assert "embedding.model" in str(caught.value)


class BrokenEmbedder(HashingEmbedder):
    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        raise RuntimeError("model.onnx: No such file or directory")


async def test_the_hub_logs_an_unchanging_reembedding_failure_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A traceback at ERROR every ``reembed_secs`` (30 s: ~2,900 a day for one missing model
    file)."""
    embedder = BrokenEmbedder()
    async with await Store.open(tmp_path / "hub", embedder=embedder) as store:
        await store.memories.save({"content": "deploy with make release"})  # saved without a vector
        hub = Hub(data_dir=tmp_path / "hub", host="127.0.0.1", port=0, embedder=embedder,
                  config=HubConfig(reembed_secs=0.02))
        with caplog.at_level(logging.INFO):
            task = asyncio.create_task(hub._reembed(SqliteHubStore(store)))
            await asyncio.sleep(0.3)  # ~15 periods
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    failures = [r for r in caplog.records if r.name.startswith("syncd.hub")
                and r.levelno >= logging.ERROR]
    assert len(failures) == 1, [r.getMessage() for r in failures]


class FlakyEmbedder(HashingEmbedder):
    """Fails while ``broken``; counts the calls it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.broken, self.calls = True, 0

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.broken:
            raise RuntimeError("model.onnx: No such file or directory")
        return super().embed(texts)


@contextlib.asynccontextmanager
async def running(work: Coroutine[object, object, None]) -> AsyncIterator[None]:
    """``work`` as a task for the block's duration, cancelled after."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Polls: the loop under test has no event to wait on (it changes plain attributes)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_memories_saved_while_the_embedder_failed_get_a_vector_once_it_works(
        tmp_path: Path) -> None:
    """Without a pull or a restart: the daemon's loop retries (slower while the embedder
    fails) and gives them their vector once it works."""
    embedder = FlakyEmbedder()
    async with await Store.open(tmp_path / "data", embedder=embedder) as store:
        await store.memories.save({"content": "deploy with make release"})
        await store.memories.save({"content": "the cache lives in redis"})
        assert len(store.index) == 0  # saved, keyword-searchable, without a vector
        async with running(reembed_while_owed(store, tick=0.01, cap=0.08)):
            await asyncio.sleep(0.5)  # ~50 ticks while it fails
            # Each pass tries the batch, then each text: 3 calls. Backing off (0.02, 0.04,
            # 0.08, 0.08…) makes ~8 passes in 0.5 s; a pass every tick would make ~50.
            assert 3 <= embedder.calls <= 3 * 12, embedder.calls
            assert store.vectors_owed and len(store.index) == 0
            embedder.broken = False
            await wait_for(lambda: not store.vectors_owed)  # the pass that gave them ended
            assert len(store.index) == 2
            calls = embedder.calls
            await asyncio.sleep(0.2)
            assert embedder.calls == calls  # nothing owed: no pass, no embedding


class GatedEmbedder(FlakyEmbedder):
    """Once ``gated``, each call announces itself and waits to be let through."""

    def __init__(self) -> None:
        super().__init__()
        self.gated, self.entered, self.release = False, threading.Event(), threading.Event()

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.gated:
            self.entered.set()
            self.release.wait()
        return super().embed(texts)


async def test_memories_are_owed_a_vector_until_the_pass_that_gives_it_ends(
        tmp_path: Path) -> None:
    """``vectors_owed`` read False while a pass was under way (it was cleared at the start),
    so whoever looked then — the daemon's loop, a status page, a test on a busy machine —
    was told nothing was owed while a memory still had no vector."""
    embedder = GatedEmbedder()
    async with await Store.open(tmp_path / "data", embedder=embedder) as store:
        await store.memories.save({"content": "deploy with make release"})  # the embedder fails
        embedder.broken, embedder.gated = False, True
        task = asyncio.create_task(store.embedding.reembed_missing())
        try:
            await asyncio.to_thread(embedder.entered.wait)  # the pass is embedding
            assert store.vectors_owed and len(store.index) == 0
        finally:
            embedder.release.set()
        assert await task == 1
        assert not store.vectors_owed and len(store.index) == 1


async def test_a_save_the_embedder_failed_is_owed_a_vector_even_if_a_pass_ran_before_its_write(
        tmp_path: Path) -> None:
    """The save marked the debt when the embedder failed, before its row was written: a pass
    in between found no row without a vector and cleared the debt, and the memory stayed
    without one until the next restart."""
    embedder = FlakyEmbedder()
    async with await Store.open(tmp_path / "data", embedder=embedder) as store:
        await store.embedding.reembed_missing()  # nothing owed
        writer_busy, release = threading.Event(), threading.Event()

        def hold(_writer: object) -> None:
            writer_busy.set()
            release.wait()

        held = asyncio.create_task(store._write(hold))
        try:
            await asyncio.to_thread(writer_busy.wait)
            save = asyncio.create_task(store.memories.save({"content": "deploy with make release"}))
            await wait_for(lambda: embedder.calls == 1)  # failed; its write waits its turn
            assert await store.embedding.reembed_missing() == 0  # the row is not there to be found
        finally:
            release.set()
        await held
        await save
        assert store.vectors_owed and len(store.index) == 0
        embedder.broken = False
        assert await store.embedding.reembed_missing() == 1


async def test_a_save_that_finds_the_embedder_working_again_ends_the_backoff(
        tmp_path: Path) -> None:
    embedder = FlakyEmbedder()
    async with await Store.open(tmp_path / "data", embedder=embedder) as store:
        await store.memories.save({"content": "deploy with make release"})
        async with running(reembed_while_owed(store, tick=0.01, cap=3600)):
            # The save's call, then seven failed passes of 2 calls (the batch, then its one
            # text) 0.02, 0.04, … 0.64 s apart: the next would come 1.28 s after the seventh.
            await wait_for(lambda: embedder.calls >= 1 + 7 * 2)
            assert len(store.index) == 0
            embedder.broken = False
            await store.memories.save({"content": "the cache lives in redis"})  # embeds: works again
            await wait_for(lambda: len(store.index) == 2, seconds=0.6)  # the next tick


async def test_rows_applied_without_a_vector_of_the_local_model_are_embedded(
        tmp_path: Path) -> None:
    """``syncd import`` and pulls of another model's rows: the loop embeds them too."""
    embedder = FlakyEmbedder()
    embedder.broken = False
    async with (await Store.open(tmp_path / "data", embedder=embedder) as store,
                running(reembed_while_owed(store, tick=0.01))):
        await wait_for(lambda: not store.vectors_owed)  # the first pass: nothing owed
        row = NodeRow(id="memory:1", content="rotate the signing key yearly",
                      updated_at="2026-01-01T00:00:00.000000000+00:00")
        result = await store.replication.apply([row], [], model="another-model")
        assert result.applied_nodes == 1
        await wait_for(lambda: len(store.index) == 1)


async def test_a_memory_saved_during_an_outage_after_a_clean_pass_is_owed_a_vector(
        tmp_path: Path) -> None:
    embedder = FlakyEmbedder()
    embedder.broken = False
    async with (await Store.open(tmp_path / "data", embedder=embedder) as store,
                running(reembed_while_owed(store, tick=0.01, cap=0.04))):
        await wait_for(lambda: not store.vectors_owed)  # a clean first pass
        embedder.broken = True
        await store.memories.save({"content": "deploy with make release"})
        assert store.vectors_owed and len(store.index) == 0
        embedder.broken = False
        await wait_for(lambda: len(store.index) == 1)
