"""MiniLM's memory rules (issue 36): the chosen session options give the old options' vectors,
the fused session keeps its own weights, and the idle unload — driven by an injected clock,
checked by state — reloads to the same vectors and never pulls the model from under an embed.
Sync tests on purpose: they run the model on this thread, as the daemon's worker threads do."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from local_store import embed_minilm as em
from local_store.embed_minilm import (
    DEFAULT_TUNING,
    PREVIOUS_TUNING,
    MiniLMEmbedder,
    SessionTuning,
)

TEXTS = ["how do I deploy", "release procedure: tag then make release", "",
         "the office plants need watering on mondays", "deploy " * 300,
         *(f"memory {i}: sqlite writer lock retry " * (1 + i % 9) for i in range(40))]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return MiniLMEmbedder(tuning=PREVIOUS_TUNING).embed(TEXTS)


@pytest.mark.parametrize("tuning", [
    DEFAULT_TUNING,
    SessionTuning(cpu_mem_arena=True, mem_pattern=True, max_batch=4),
    SessionTuning(optimization="disabled", max_batch=1),
    SessionTuning(optimization="basic", inter_op_threads=2),
])
def test_session_options_give_the_previous_options_vectors(
        reference: np.ndarray, tuning: SessionTuning) -> None:
    vectors = MiniLMEmbedder(tuning=tuning).embed(TEXTS)
    assert float(np.abs(vectors - reference).max()) <= 1e-5
    assert not vectors[2].any()


def test_the_fused_session_keeps_its_own_copy_of_the_weights() -> None:
    # MiniLMEmbedder drops its arrays once the session is built: that is only safe while
    # onnxruntime copies them (pre-packing on). Overwrite them after the build: nothing moves.
    import onnxruntime as ort

    fused = em.fused_minilm(em._MINILM_MODEL.verify(em._MINILM_MODEL.locate()))
    weights = fused.session_weights()
    session = em.fused_session(ort, fused.graph, weights, DEFAULT_TUNING.options(ort, 1))
    embedder = MiniLMEmbedder(1)
    texts = TEXTS[:5]
    before = embedder.embed(texts)
    with embedder._using() as loaded:
        mine = em._Loaded(session, loaded.tokenizer, em.WordTable(fused.words))
    embedder._loaded = mine
    first = embedder.embed(texts)
    for array in weights.values():
        _overwrite(array, 7.0)
    assert float(np.abs(embedder.embed(texts) - first).max()) == 0.0
    assert float(np.abs(first - before).max()) <= 1e-5


def _overwrite(array: np.ndarray, value: float) -> None:
    """Write into a read-only array's buffer (what a session reading it in place would see)."""
    import ctypes

    filled = np.full(array.shape, value, dtype=array.dtype)
    ctypes.memmove(array.ctypes.data, filled.ctypes.data, array.nbytes)


def test_idle_unload_by_state_and_reload_gives_the_same_vectors(reference: np.ndarray) -> None:
    clock = Clock()
    embedder = MiniLMEmbedder(idle_unload_secs=600, clock=clock)
    assert embedder.unload_if_idle() == 600  # nothing loaded: ask again a period later
    first = embedder.embed(TEXTS)
    clock.now += 599
    assert embedder.unload_if_idle() == pytest.approx(1)  # not idle long enough: due in 1 s
    assert embedder.loaded
    clock.now += 1
    assert embedder.unload_if_idle() == 600
    assert not embedder.loaded and embedder.unload_count == 1
    assert embedder.unload_if_idle() == 600  # already unloaded: nothing happens
    again = embedder.embed(TEXTS)
    assert embedder.loaded and embedder.load_count == 2
    assert np.array_equal(again, first)
    assert float(np.abs(again - reference).max()) <= 1e-5


def test_an_embed_counts_as_use_and_never_unloading_is_the_default() -> None:
    clock = Clock()
    embedder = MiniLMEmbedder(idle_unload_secs=10, clock=clock)
    embedder.embed(["first"])
    clock.now += 9
    embedder.embed(["second"])  # a use resets the idle time
    clock.now += 9
    assert embedder.unload_if_idle() == pytest.approx(1) and embedder.loaded
    never = MiniLMEmbedder(clock=clock)
    never.embed(["x"])
    clock.now += 1e9
    assert never.unload_if_idle() == float("inf") and never.loaded


def test_no_unload_while_an_embed_is_in_flight() -> None:
    clock = Clock()
    embedder = MiniLMEmbedder(idle_unload_secs=5, clock=clock)
    expected = embedder.embed(TEXTS[:3])
    with embedder._using() as loaded:  # an embed holding the session
        clock.now += 60
        assert embedder.unload_if_idle() == 5  # skipped: the embed marks a use when it ends
        assert embedder.loaded and embedder.unload_count == 0
        assert loaded.session is embedder._session
    assert embedder.unload_if_idle() == 5  # its end was a use: idle again from there
    assert embedder.loaded
    clock.now += 5
    embedder.unload_if_idle()
    assert not embedder.loaded
    assert np.array_equal(embedder.embed(TEXTS[:3]), expected)


def test_concurrent_embeds_while_the_timer_unloads_are_safe() -> None:
    clock = Clock()
    embedder = MiniLMEmbedder(idle_unload_secs=1, clock=clock)
    texts = TEXTS[:4]
    expected = embedder.embed(texts)
    failures: list[BaseException] = []
    results: list[bool] = []
    stop = threading.Event()

    def embed_repeatedly() -> None:
        try:
            for _ in range(15):
                results.append(bool(np.array_equal(embedder.embed(texts), expected)))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    def unload_repeatedly() -> None:
        while not stop.is_set():
            clock.now += 10  # every ask finds the model idle long enough
            embedder.unload_if_idle()

    workers = [threading.Thread(target=embed_repeatedly) for _ in range(3)]
    timer = threading.Thread(target=unload_repeatedly)
    timer.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    timer.join()
    assert failures == []
    assert results == [True] * 45
    assert embedder.load_count == embedder.unload_count + int(embedder.loaded)


def test_bad_tuning_and_idle_values_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        MiniLMEmbedder(tuning=SessionTuning(max_batch=0))
    with pytest.raises(ValueError, match="idle_unload_secs must be >= 0"):
        MiniLMEmbedder(idle_unload_secs=-1)
