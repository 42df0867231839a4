"""The fused MiniLM graph without ``onnx`` in the daemon (issue 36): word embeddings gathered
outside the session give the very vectors of the table inside it, and the graph built once in a
child process and kept on disk loads without importing ``onnx``; a corrupt or partial file is
built again, and a directory that cannot be written falls back to building in this process.

Sync tests on purpose: they run the model on this thread, as the daemon's worker threads do."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from local_store import embed_minilm as em
from local_store import minilm_cache
from local_store.embed_minilm import MiniLMEmbedder
from local_store.minilm_graph import WORD_EMBEDDING, FusedModel, Quantised
from tests.local_store.test_embed_minilm import REPO_ROOT, offline_env, run_probe

# Long texts up to and past the 256-token truncation (128 among them), blank ones, repeated
# tokens (one distinct id many times), a text repeated in the batch, non-ASCII.
TEXTS = ["how do I deploy", "", "   ", "the the the the the the", "deploy " * 126,
         "deploy " * 254, "deploy " * 400, "release procedure: tag then make release",
         "how do I deploy", "日本語のテキスト", "🙂" * 50, "a",
         *(f"memory {i}: sqlite writer lock retry {'x' * i} " * (1 + i % 30) for i in range(40))]


def _model_file() -> bytes:
    return em._MINILM_MODEL.verify(em._MINILM_MODEL.locate())


def _table_inside(fused: FusedModel) -> MiniLMEmbedder:
    """An embedder running the fused graph as it was before: the whole float32 word table an
    initializer of the session, fed the token ids themselves."""
    import onnx
    import onnxruntime as ort

    model = onnx.load_model_from_string(fused.graph)
    (word_input,) = [i for i in model.graph.input if i.name == WORD_EMBEDDING]
    model.graph.input.remove(word_input)
    table = onnx.TensorProto(name=WORD_EMBEDDING, data_type=onnx.TensorProto.FLOAT,
                             dims=fused.words.shape, data_location=onnx.TensorProto.EXTERNAL)
    entry = table.external_data.add()
    entry.key, entry.value = "location", "in-memory"
    model.graph.initializer.append(table)
    assert isinstance(fused.words, Quantised)
    weights = {**fused.session_weights(), WORD_EMBEDDING: fused.words.dequantised()}
    session = em.fused_session(ort, model.SerializeToString(), weights,
                               em.DEFAULT_TUNING.options(ort, 2))
    embedder = MiniLMEmbedder()
    with embedder._using() as loaded:
        tokenizer = loaded.tokenizer
    embedder._loaded = em._Loaded(session, tokenizer)  # words None: the ids go in as they are
    return embedder


def test_rows_gathered_outside_give_the_table_insides_vectors_exactly() -> None:
    fused = em.fused_minilm(_model_file())
    inside = _table_inside(fused).embed(TEXTS)
    outside = MiniLMEmbedder()
    assert float(np.abs(outside.embed(TEXTS) - inside).max()) == 0.0
    assert all(np.array_equal(outside.embed([t]), _table_inside(fused).embed([t]))
               for t in TEXTS[:12])
    assert not inside[1].any() and not inside[2].any()


def test_the_word_table_is_fed_only_the_rows_it_needs() -> None:
    fused = em.fused_minilm(_model_file())
    words = em.WordTable(fused.words)
    ids = np.array([[101, 7, 7, 9, 102], [101, 9, 102, 0, 0]], dtype=np.int32)
    fed = words.feed(ids)
    assert fed["input_ids"].dtype == np.int32 and fed["input_ids"].shape == ids.shape
    assert fed[WORD_EMBEDDING].shape == (5, 384)  # 0, 7, 9, 101, 102
    assert isinstance(fused.words, Quantised)
    whole = fused.words.dequantised()
    assert np.array_equal(fed[WORD_EMBEDDING][fed["input_ids"]].view(np.uint32),
                          whole[ids].view(np.uint32))
    assert fused.words.values.dtype == np.int8  # 11.7 MB kept, not 47 MB of float32


def test_the_kept_build_round_trips_bit_for_bit(tmp_path: Path) -> None:
    fused = em.fused_minilm(_model_file())
    path = minilm_cache.cache_path(tmp_path, em._MINILM_MODEL.sha256)
    minilm_cache.write(path, fused)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary left
    kept = minilm_cache.read(path)
    assert kept is not None and kept.graph == fused.graph
    assert set(kept.weights) == set(fused.weights)
    mine, theirs = fused.session_weights(), kept.session_weights()
    assert all(np.array_equal(mine[n].view(np.uint32), theirs[n].view(np.uint32)) for n in mine)
    assert path.stat().st_size < 24_000_000  # int8 + scales, not ~90 MB of float32


PROBE = r'''
import json, sys
from pathlib import Path
import numpy as np
from local_store.embed_minilm import MiniLMEmbedder
texts = json.loads(sys.argv[2])
cache = Path(sys.argv[1])
r = {}
first = MiniLMEmbedder(cache_dir=cache)
v = first.embed(texts)
(kept,) = cache.iterdir()
r["kept"] = kept.name
stamp = (kept.stat().st_ino, kept.stat().st_mtime_ns)
again = MiniLMEmbedder(cache_dir=cache).embed(texts)
r["hit_rebuilt"] = (kept.stat().st_ino, kept.stat().st_mtime_ns) != stamp
r["same"] = bool(np.array_equal(v, again))
r["onnx_imported"] = "onnx" in sys.modules
r["onnxruntime_imported"] = "onnxruntime" in sys.modules
np.save(sys.argv[3], v)
print("PROBE-RESULT " + json.dumps(r))
'''


def _probe(cache: Path, out: Path) -> dict[str, object]:
    return run_probe(textwrap.dedent(f"""
        import sys
        sys.argv = ["probe", {str(cache)!r}, {json.dumps(json.dumps(TEXTS))}, {str(out)!r}]
    """) + PROBE, offline_env())


def test_a_kept_build_loads_without_importing_onnx(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Built by a child process into an empty directory, then read back by a second embedder:
    # this process never imports onnx either way.
    first = _probe(cache, tmp_path / "first.npy")
    assert first["kept"] == minilm_cache.cache_path(cache, em._MINILM_MODEL.sha256).name
    assert first["hit_rebuilt"] is False and first["same"] is True
    assert first["onnx_imported"] is False and first["onnxruntime_imported"] is True
    hit = _probe(cache, tmp_path / "hit.npy")  # a fresh process, the file already there
    assert hit["onnx_imported"] is False and hit["hit_rebuilt"] is False
    expected = MiniLMEmbedder().embed(TEXTS)  # built here, as without a cache
    assert np.array_equal(np.load(tmp_path / "first.npy"), expected)
    assert np.array_equal(np.load(tmp_path / "hit.npy"), expected)


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "partial":
        path.write_bytes(data[:len(data) // 2])
    elif how == "flipped byte":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    else:  # a well-formed file whose contents no longer match its recorded sha256
        with np.load(path, allow_pickle=False) as kept:
            entries = {name: kept[name] for name in kept.files}
        name = next(n for n in sorted(entries) if n.startswith("s:"))
        entries[name] = entries[name] * np.float32(2)
        with path.open("wb") as out:
            np.savez(out, allow_pickle=False, **entries)


@pytest.mark.parametrize("how", ["partial", "flipped byte", "stale digest"])
def test_a_corrupt_build_is_noticed_and_built_again(
        tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    path = minilm_cache.cache_path(tmp_path, em._MINILM_MODEL.sha256)
    expected = MiniLMEmbedder().embed(TEXTS[:8])
    MiniLMEmbedder(cache_dir=tmp_path).embed(["build it"])
    _corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger="local_store.minilm_cache"):
        vectors = MiniLMEmbedder(cache_dir=tmp_path).embed(TEXTS[:8])
    assert "unusable" in caplog.text
    assert np.array_equal(vectors, expected)  # built again: the same vectors
    assert minilm_cache.read(path) is not None  # and kept whole this time
    _corrupt(path, how)
    assert minilm_cache.read(path) is None
    assert not path.exists()  # removed, so the next load builds it


def test_an_unwritable_cache_falls_back_to_building_here(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    embedder = MiniLMEmbedder(cache_dir=blocker / "cache")
    with caplog.at_level(logging.WARNING):
        vectors = embedder.embed(TEXTS[:8])
    assert "building it in this process" in caplog.text
    assert np.array_equal(vectors, MiniLMEmbedder().embed(TEXTS[:8]))


def test_the_child_refuses_a_bad_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "local_store.minilm_cache"], cwd=REPO_ROOT,
                          env=offline_env(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and "usage" in done.stderr
