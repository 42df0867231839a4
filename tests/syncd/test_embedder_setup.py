"""The embedder as the daemon and the hub set it up and run it: a model that cannot load is a
configuration error (exit 2, not "try again"), and the hub's periodic re-embedding reports a
failure that does not change once, not every period."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from local_store import HashingEmbedder, Store
from syncd.daemon import StartupError, make_embedder
from syncd.exits import EXIT_CONFIG
from syncd.hub.server import Hub
from syncd.hub.store import SqliteHubStore


def test_bge_without_its_files_is_a_configuration_error(tmp_path: Path) -> None:
    """``embedding.model = "bge-small-en-v1.5"`` with a cache_dir that lacks the files (or no
    fastembed): the loader's error escaped, so `syncd run` exited 75 ("try again") with a
    traceback, and `syncd hub` died with an uncaught one. Retrying never helps."""
    with pytest.raises(StartupError) as caught:
        make_embedder("bge-small-en-v1.5", tmp_path / "empty-cache")
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
        await store.save({"content": "deploy with make release"})  # saved without a vector
        hub = Hub(data_dir=tmp_path / "hub", host="127.0.0.1", port=0, embedder=embedder,
                  reembed_secs=0.02)
        with caplog.at_level(logging.INFO):
            task = asyncio.create_task(hub._reembed(SqliteHubStore(store)))
            await asyncio.sleep(0.3)  # ~15 periods
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    failures = [r for r in caplog.records if r.name.startswith("syncd.hub")
                and r.levelno >= logging.ERROR]
    assert len(failures) == 1, [r.getMessage() for r in failures]
