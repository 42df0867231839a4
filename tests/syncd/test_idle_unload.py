"""The daemon's idle-unload timer (issue 36): asks the embedder when it said to, stops when it
says never; ``embedding.idle_unload_secs`` reaches the MiniLM embedder."""

from __future__ import annotations

import asyncio
import math

from syncd.config import EmbeddingConfig
from syncd.daemon import IdleUnloading, make_embedder, unload_when_idle


class CountingEmbedder:
    """Answers 0 s (ask again now) twice, then never."""

    def __init__(self) -> None:
        self.calls = 0

    def unload_if_idle(self) -> float:
        self.calls += 1
        return 0.0 if self.calls < 3 else math.inf


async def test_the_timer_asks_again_when_told_and_stops_on_never() -> None:
    embedder = CountingEmbedder()
    async with asyncio.timeout(30):
        await unload_when_idle(embedder)
    assert embedder.calls == 3


def test_the_configured_idle_time_reaches_minilm_and_hashing_has_no_timer() -> None:
    minilm = make_embedder(EmbeddingConfig(model="all-MiniLM-L6-v2", idle_unload_secs=7.5),
                           idle_unload=True)
    assert isinstance(minilm, IdleUnloading)
    assert minilm.idle_unload_secs == 7.5  # type: ignore[attr-defined]
    assert not minilm.loaded  # type: ignore[attr-defined]  # construction loads nothing
    assert not isinstance(make_embedder(EmbeddingConfig(model="hashing"), idle_unload=True),
                          IdleUnloading)
