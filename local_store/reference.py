"""Generic text a match is judged against: syncd's confident tier (``recall.py``).

A sentence embedder puts every text somewhere, so a memory is always *some* distance from any
prompt, and a cosine cut-off means different things for different models (MiniLM's cosines of
unrelated sentences sit near 0.1, bge's near 0.5) and, fitted on a store, for different stores
(one full of near-identical notes made every real question look strange). Instead a memory is
judged against a fixed set of generic texts (``data/background.txt``, written for this by a
session that never saw an eval's queries, and never tuned on them), in six parts:
conversation ("continue", "thanks, that works now"), agent instructions without a project,
general programming questions, everyday life, jokes, and nonsense. A memory confidently
answers a prompt when, by cosine,

  * the prompt is nearer the memory than the memory is to any generic text: the memory is
    not just as close to a general programming question or to small talk; and
  * the prompt is nearer the memory than to any text of the parts that carry no programming
    topic (``OFF_TOPIC_PARTS``): the prompt is not small talk, everyday life, a joke or
    nonsense. Agent instructions and programming questions stay out of this side: a prompt
    like "how do I run the tests locally?" is what a project's memories answer.

Both sides involve the prompt, the memory and the fixed texts only, so what else a store holds
— hundreds of near-identical notes, one topic, ten memories or a million — cannot change it.

Keyword evidence is weighed against common words: a query word that is neither in the generic
texts nor a whole word of the shipped MiniLM tokenizer's vocabulary (~21,700 common English
words: WordPiece keeps frequent words whole and splits the rest) is specific to what someone
wrote down — ``pgbouncer``, ``ERR_LEDGER_LOCK``, ``e1310`` — where ``continue``, ``deploy``
or ``thanks`` are not (``generic_words``).

The default model's vectors of the texts ship in the package (``SHIPPED``, float16, written by
``make reference`` and checked by a test): MiniLM embeds ~50 texts a second here, so computing
them would keep a first start's recall waiting for half a minute. Another model's are computed
once and kept in the data directory (``reference-<model>-<digest>.npy``), so a restart reads
them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from local_store.embed import Embedder
from local_store.heap import release_freed_memory
from local_store.ranking import tokenize
from local_store.vectors import unit_rows

log = logging.getLogger(__name__)

REFERENCE_FILE = "background.txt"
SHIPPED = {"all-MiniLM-L6-v2": ("all-MiniLM-L6-v2", "reference.npz")}  # model → data file
TOKENIZER_FILE = ("all-MiniLM-L6-v2", "tokenizer.json")
# The parts whose texts carry no programming topic: a prompt nearer one of them than a memory is
# not asking for that memory.
OFF_TOPIC_PARTS = frozenset({"conversation", "everyday", "jokes", "nonsense"})
PART_MARK = "## "
EMBED_BATCH = 64
# Vectors that took this long to compute are kept in the data directory; quicker ones (the
# hashing embedder's: milliseconds) are recomputed rather than leave a file there.
KEEP_AFTER_SECS = 1.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@functools.cache
def reference_parts() -> tuple[tuple[str, str], ...]:
    """(part, text) for each generic text of the shipped file: one per line, ``#`` lines are
    comments, and a ``## <part>: …`` line starts a part."""
    text = resources.files("local_store").joinpath("data", REFERENCE_FILE).read_text("utf-8")
    part, out = "", []
    for line in (raw.strip() for raw in text.splitlines()):
        if line.startswith(PART_MARK):
            part = line[len(PART_MARK):].split(":", 1)[0].strip()
        elif line and not line.startswith("#"):
            out.append((part, line))
    return tuple(out)


def reference_texts() -> tuple[str, ...]:
    return tuple(text for _, text in reference_parts())


@functools.cache
def generic_words() -> frozenset[str]:
    """Words too common to be evidence on their own: every token (``ranking.tokenize``) of the
    generic texts, and every whole alphabetic word of the shipped tokenizer's vocabulary."""
    words = {word for text in reference_texts() for word in tokenize(text)}
    tokenizer = resources.files("local_store").joinpath("data", *TOKENIZER_FILE)
    vocab = json.loads(tokenizer.read_text("utf-8"))["model"]["vocab"]
    words.update(token for token in vocab if len(token) >= 2 and token.isalpha())
    del vocab
    release_freed_memory()  # the parsed tokenizer file: ~7 MB kept resident otherwise
    return frozenset(words)


@functools.cache
def _digest() -> str:
    parts = "\n".join(f"{part}\t{text}" for part, text in reference_parts())
    return hashlib.sha256(parts.encode()).hexdigest()[:12]


class Reference:
    """The generic texts' unit vectors under one model, kept as columns (``dim × n``, so a
    product is BLAS's plain kernel), those of the parts with no programming topic apart."""

    def __init__(self, model: str, vectors: npt.NDArray[np.float32],
                 off_topic: npt.NDArray[np.bool_]) -> None:
        self.model = model
        self.vectors = vectors
        self._columns = np.ascontiguousarray(vectors.T)
        self._off_topic_columns = np.ascontiguousarray(vectors[off_topic].T)

    def best(self, rows: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The highest cosine of each unit row of ``rows`` with any generic text."""
        matrix = np.asarray(rows, dtype=np.float32).reshape(-1, self._columns.shape[0])
        best: npt.NDArray[np.float32] = (matrix @ self._columns).max(axis=1)
        return best

    def best_off_topic(self, row: npt.ArrayLike) -> float:
        """The highest cosine of one unit vector with a text of ``OFF_TOPIC_PARTS``."""
        return float((np.asarray(row, dtype=np.float32) @ self._off_topic_columns).max())


def _reference(model: str, vectors: npt.NDArray[np.float32]) -> Reference:
    parts = np.array([part in OFF_TOPIC_PARTS for part, _ in reference_parts()])
    return Reference(model, vectors, parts)


def load_reference(embedder: Embedder, data_dir: Path | None) -> Reference:
    """The reference under ``embedder``'s model: the packaged one (``SHIPPED``), else read
    from ``data_dir`` when a previous run kept it, else embedded — and kept there when that
    took ``KEEP_AFTER_SECS`` or more. A file that cannot be read or written only costs the
    embedding again."""
    shipped = _shipped(embedder.model_id, embedder.dim)
    if shipped is not None:
        return _reference(embedder.model_id, shipped)
    name = f"reference-{_UNSAFE.sub('_', embedder.model_id)}-{_digest()}.npy"
    path = None if data_dir is None else data_dir / name
    if path is not None:
        try:
            kept = np.load(path, allow_pickle=False)
            if kept.shape == (len(reference_texts()), embedder.dim) and np.isfinite(kept).all():
                return _reference(embedder.model_id, kept.astype(np.float32))
        except (OSError, ValueError):
            pass
    started = time.monotonic()
    vectors = _embedded(embedder)
    if path is not None and time.monotonic() - started >= KEEP_AFTER_SECS:
        _keep(path, vectors)
    return _reference(embedder.model_id, vectors)


@functools.cache
def _shipped(model: str, dim: int) -> npt.NDArray[np.float32] | None:
    """The packaged vectors of ``model``, when they are of these very texts."""
    if model not in SHIPPED:
        return None
    try:
        with resources.as_file(resources.files("local_store").joinpath(
                "data", *SHIPPED[model])) as path, np.load(path, allow_pickle=False) as kept:
            vectors, digest = kept["vectors"], str(kept["digest"])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("cannot read the packaged recall reference of %s (%s); embedding its "
                    "texts instead", model, exc)
        return None
    if digest != _digest() or vectors.shape != (len(reference_texts()), dim):
        log.warning("the packaged recall reference of %s is not of its texts (`make "
                    "reference` writes it); embedding them instead", model)
        return None
    return unit_rows(vectors.astype(np.float32))


def write_shipped(embedder: Embedder) -> Path:
    """Embed the texts with ``embedder`` (a model of ``SHIPPED``) into its packaged file:
    ``make reference`` after editing ``data/background.txt``."""
    path = Path(str(resources.files("local_store").joinpath("data", *SHIPPED[embedder.model_id])))
    np.savez_compressed(path, vectors=_embedded(embedder).astype(np.float16),
                        digest=np.array(_digest()))
    return path


def _embedded(embedder: Embedder) -> npt.NDArray[np.float32]:
    texts = reference_texts()
    parts = [np.asarray(embedder.embed(list(texts[i:i + EMBED_BATCH])), dtype=np.float32)
             for i in range(0, len(texts), EMBED_BATCH)]
    return unit_rows(np.concatenate(parts))


def _keep(path: Path, vectors: npt.NDArray[np.float32]) -> None:
    """Write ``path`` whole or not at all, and drop the files of earlier reference texts."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as out:
            np.save(out, vectors, allow_pickle=False)
        os.replace(temporary, path)
        model_prefix = path.name.rsplit("-", 1)[0] + "-"
        for old in path.parent.glob(f"{model_prefix}{'?' * len(_digest())}.npy"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("cannot keep the recall reference in %s (%s)", path, exc)
        temporary.unlink(missing_ok=True)
