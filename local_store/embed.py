"""Embedders: ``model_id``, ``dim``, and a batch ``embed`` returning L2-normalised float32 rows.

Every stored vector records the ``model_id`` that made it; vectors of different models are never
compared. ``HashingEmbedder`` is deterministic and dependency-free (feature hashing of word and
character-trigram tokens); it exists for fast tests and benchmarks, not for quality.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]

_WORD = re.compile(r"\w+", re.UNICODE)


@runtime_checkable
class Embedder(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str]) -> Vectors:
        """Return a (len(texts), dim) float32 matrix of unit rows (zero rows for empty text)."""
        ...


def normalise_rows(matrix: Vectors) -> Vectors:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Vectors = (matrix / norms).astype(np.float32, copy=False)
    return out


class HashingEmbedder:
    """Signed feature hashing of lower-cased words and their character trigrams."""

    def __init__(self, dim: int = 384, model_id: str | None = None) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self._dim = dim
        self._model_id = model_id or f"hashing-{dim}"

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: list[str]) -> Vectors:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in _features(text):
                digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                sign = 1.0 if value & 1 else -1.0
                out[row, (value >> 1) % self._dim] += sign
        return normalise_rows(out)


def _features(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    grams = [f"#{w[i:i + 3]}" for w in words if len(w) > 3 for i in range(len(w) - 2)]
    return words + grams


def to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


LITTLE_F4 = np.dtype("<f4")


def blob_view(vector: npt.NDArray[np.float32]) -> memoryview | bytes:
    """What ``to_blob`` gives, without the copy when ``vector`` already is contiguous
    little-endian float32 (SQLite binds the buffer as the same BLOB)."""
    if vector.dtype == LITTLE_F4 and vector.flags.c_contiguous:
        return vector.data
    return to_blob(vector)


def from_blob(blob: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(blob, dtype="<f4")
