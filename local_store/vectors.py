"""An in-RAM float32 matrix of one embedding model's vectors, with exact cosine top-k.

Rules:
  * One index per model id; a query vector is only ever compared with vectors of its own model.
  * Rows are unit vectors (the embedders normalise; ``unit_rows`` scales any other vector as it
    enters), so cosine similarity is a dot product.
  * The index mirrors the ``vectors`` table: rebuilt at start-up, then updated after each
    committed write (never from inside the transaction). Removal swaps in the last vector, so
    the matrix stays dense; capacity grows by doubling. Built from the store (at open, and after
    a pull with no room for its vectors dropped it: ``Shell.drop_index``), the matrix has room
    for a quarter more, so a pull never copies a matrix beside its batches and the first saves
    after it do not double it.
  * Vectors are stored as columns (``dim × capacity``): the query's product is then OpenBLAS's
    plain matrix-vector kernel, which reads the matrix faster than the transposed kernel a
    row per vector calls for (``bench/recall_speed.py``). Writing a block of
    rows transposes it 64 rows at a time, so each piece stays in cache.
  * Writers (the event loop, after a commit) and readers (recall's thread) meet at one lock:
    ``snapshot`` compares a query with every row and takes the ids while holding it, so a reader
    never sees a row moved under it.
  * Snapshots share one immutable tuple of the ids, built on the first snapshot after a write
    that added or moved an id (re-embedding a known id moves nothing), so a read-mostly store
    copies its ids once per write rather than once per query.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]
SAMPLE_STRIDE = 8  # nearest_rows: partition every 8th similarity first
T = TypeVar("T")
BLOCK = 64  # rows transposed into the column matrix at a time (64 × 384 floats: 96 KiB)
# fill_derived's rows at a time: with ~1,400 generic texts a chunk's product is 2.8 MB. At 2048
# it was 11 MB, freed and allocated again chunk after chunk on the fill's thread: past its first
# free glibc serves a block that size from the thread's heap and keeps twice it resident
# (its dynamic mmap and trim thresholds), ~22 MiB held after a pull. No slower (~1 s at 100k).
FILL_CHUNK = 512


def nearest_rows(sims: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.intp]:
    """Positions of the ``k`` (≥ 1) largest ``sims``, in no order: the same set as
    ``np.argpartition(-sims, k - 1)[:k]``, in half its time on 100k rows.

    The k-th largest of a strided sample is a floor that at least k rows reach, so the top k
    are among the rows reaching it (about 8·k): only those are partitioned. When the k-th
    largest value also belongs to a row left out, which of the tied rows make the cut is
    argpartition's choice, so then argpartition decides over every row (NaN rows never count,
    as with argpartition while k rows are not NaN).
    """
    n = len(sims)
    if k >= n:
        return np.arange(n)
    sample = sims[::SAMPLE_STRIDE]
    if len(sample) > 2 * k:
        floor = np.partition(sample, len(sample) - k)[len(sample) - k]
        rows = np.flatnonzero(sims >= floor)
        if len(rows) >= k:
            top = rows[np.argpartition(-sims[rows], k - 1)[:k]]
            cut = sims[top].min()
            if np.count_nonzero(sims[rows] == cut) == np.count_nonzero(sims[top] == cut):
                return top
    return np.argpartition(-sims, k - 1)[:k]


def unit_rows(rows: Matrix) -> Matrix:
    """``rows`` scaled to length 1 (zero rows stay zero), so a dot product is a cosine. The
    embedders' vectors already are; a pulled or imported one may not be (a norm-10 vector
    outranked an exact match), and is scaled here, where every vector enters the index."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    if np.all(np.abs(norms - 1.0) < 1e-3):
        return rows
    norms[norms == 0] = 1.0
    scaled: Matrix = (rows / norms).astype(np.float32, copy=False)
    return scaled


class VectorIndex:
    def __init__(self, model: str, dim: int, capacity: int = 1024) -> None:
        self.model = model
        self.dim = dim
        self._columns: Matrix = np.zeros((dim, max(capacity, 1)), dtype=np.float32)
        self._ids: list[str] = []
        self._frozen_ids: tuple[str, ...] | None = None  # ``_ids`` as of now; None: stale
        self._rows: dict[str, int] = {}
        self._lock = threading.Lock()
        # ``derived``'s value of each row's vector (NaN: not computed yet), beside the columns
        self._derived: npt.NDArray[np.float32] = np.full(max(capacity, 1), np.nan, np.float32)
        self._generation = 0  # moves on with every change of a vector

    @classmethod
    def from_rows(cls, model: str, dim: int, ids: list[str], blobs: Sequence[bytes]) -> VectorIndex:
        """Build from each id's little-endian float32 blob (``dim`` floats each)."""
        if len(blobs) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(blobs)} vectors")
        rows = list(zip(ids, blobs, strict=True))
        return cls.from_blocks(model, dim, len(ids),
                               (rows[at:at + BLOCK] for at in range(0, len(rows), BLOCK)))

    @classmethod
    def from_blocks(cls, model: str, dim: int, count: int,
                    blocks: Iterable[Sequence[tuple[str, bytes]]], *,
                    room: float = 0.25) -> VectorIndex:
        """Build from ``(id, little-endian float32 blob)`` rows given a block at a time — a
        cursor's ``fetchmany`` — into a matrix of the ``count`` expected and ``room`` as much
        again for rows to come (more rows than announced only grow it). Each block's blobs
        are joined alone, so neither a list of every blob nor a copy of them all is ever made
        (at 100k memories each was 150 MB beside the index)."""
        index = cls(model, dim, capacity=max(1024, count + int(count * room)))
        for block in blocks:
            if not block:
                continue
            start = len(index._ids)
            index._reserve(start + len(block))
            index._put_blocks(start, [blob for _, blob in block],
                              lambda chunk: np.frombuffer(b"".join(chunk), dtype="<f4"))
            index._ids.extend(mid for mid, _ in block)
        index._rows = {mid: row for row, mid in enumerate(index._ids)}
        return index

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, memory_id: object) -> bool:
        return memory_id in self._rows

    @property
    def capacity(self) -> int:
        """How many vectors the matrix has room for before it must grow."""
        return int(self._columns.shape[1])

    @property
    def ids(self) -> list[str]:
        return self._ids

    @property
    def matrix(self) -> Matrix:
        """The live vectors, one row each (a transposed view of the columns, not contiguous;
        do not keep it across writes)."""
        return self._columns[:, : len(self._ids)].T

    def snapshot(self, query: npt.ArrayLike) -> tuple[tuple[str, ...], npt.NDArray[np.float32]]:
        """(ids, cosine of ``query`` with each) as of one instant — safe from any thread."""
        with self._lock:
            if self._frozen_ids is None:
                self._frozen_ids = tuple(self._ids)
            return self._frozen_ids, self.similarities(query)

    def cosines(self, ids: Sequence[str], query: npt.NDArray[np.float32],
                snapshot: tuple[tuple[str, ...], npt.NDArray[np.float32]],
                ) -> dict[str, float]:
        """The cosine of ``query`` with each of ``ids`` the index holds: read from
        ``snapshot`` (``snapshot(query)``'s answer) where the id is still at its place there —
        a vector is a strided column here, and gathering one at 100k memories misses the
        cache on every element — and computed for the others."""
        ids_then, sims = snapshot
        with self._lock:
            rows = {mid: row for mid in ids if (row := self._rows.get(mid)) is not None}
            moved = [mid for mid, row in rows.items()
                     if row >= len(ids_then) or ids_then[row] != mid]
            columns = self._columns[:, [rows[mid] for mid in moved]].T.copy() if moved else None
        out = {mid: float(sims[row]) for mid, row in rows.items() if mid not in moved}
        if columns is not None:
            out.update(zip(moved, (columns @ query).tolist(), strict=True))
        return out

    def derived(self, ids: Sequence[str],
                compute: Callable[[Matrix], npt.NDArray[np.float32]]) -> dict[str, float]:
        """``compute``'s value (one per row of the vectors given) of each of ``ids`` the index
        holds — the confident tier's best cosine of a memory with the generic texts
        (``recall.py``) — kept beside each vector until it changes: computed here for the rows
        ``fill_derived`` has not reached yet. One ``compute`` per index: the values do not
        say which computed them."""
        with self._lock:
            rows = {mid: row for mid in ids if (row := self._rows.get(mid)) is not None}
            out = {mid: float(self._derived[row]) for mid, row in rows.items()}
            missing = [mid for mid, value in out.items() if value != value]  # NaN
            columns = (self._columns[:, [rows[mid] for mid in missing]].T.copy()
                       if missing else None)
            generation = self._generation
        if columns is None:
            return out
        fresh = compute(columns)
        out.update(zip(missing, fresh.tolist(), strict=True))
        with self._lock:
            if self._generation == generation:  # no vector moved or changed meanwhile
                self._derived[[rows[mid] for mid in missing]] = fresh
        return out

    def fill_derived(self, compute: Callable[[Matrix], npt.NDArray[np.float32]],
                     stop: Callable[[], bool] = lambda: False, chunk: int = FILL_CHUNK) -> int:
        """Compute ``derived``'s value for every row that lacks it, ``chunk`` contiguous rows
        at a time (a block of columns is read in ``dim`` runs, not a cache miss per element),
        so that recall finds them ready; returns how many, when done or ``stop()``. Run on a
        thread of its own: at 100k memories and ~1,400 generic texts it is ~100 GFLOP, seconds
        of one core. A chunk a write moved meanwhile is computed again."""
        done, start = 0, 0
        while not stop():
            with self._lock:
                size = len(self._ids)
                while start < size and not np.isnan(
                        self._derived[start:min(size, start + chunk)]).any():
                    start += chunk
                if start >= size:
                    return done
                end = min(size, start + chunk)
                block = self._columns[:, start:end].T.copy()
                generation = self._generation
            values = compute(block)
            with self._lock:
                if self._generation == generation:
                    self._derived[start:end] = values
                    done += end - start
                    start = end
        return done

    def upsert(self, memory_id: str, vector: npt.ArrayLike) -> None:
        values = np.asarray(vector, dtype=np.float32).reshape(-1)
        if values.shape[0] != self.dim:
            raise ValueError(f"vector for {memory_id} has dim {values.shape[0]}, want {self.dim}")
        with self._lock:
            self._upsert(memory_id, values)

    def _upsert(self, memory_id: str, values: npt.NDArray[np.float32]) -> None:
        self._generation += 1
        row = self._rows.get(memory_id)
        if row is None:
            row = len(self._ids)
            self._reserve(row + 1)
            self._ids.append(memory_id)
            self._rows[memory_id] = row
            self._frozen_ids = None
        self._columns[:, row] = unit_rows(values.reshape(1, -1))[0]
        self._derived[row] = np.nan

    def apply(self, changes: list[tuple[str, npt.NDArray[np.float32] | None]]) -> None:
        """Upserts (a vector) and removals (None) in order, under one lock acquisition — what a
        committed transaction hands over, thousands at a time for a pulled page. A run of ids
        new to the index is appended as one block (a bootstrap page is all new ids)."""
        with self._lock:
            appending: dict[str, npt.NDArray[np.float32]] = {}
            for memory_id, values in changes:
                if values is not None and values.shape[0] == self.dim:
                    if memory_id in appending or memory_id not in self._rows:
                        appending[memory_id] = values
                        continue
                    self._append(appending)
                    self._upsert(memory_id, values)
                else:
                    self._append(appending)
                    self._remove(memory_id)
            self._append(appending)

    def _append(self, new: dict[str, npt.NDArray[np.float32]]) -> None:
        """Add vectors for ids not in the index (emptying ``new``), growing the matrix once."""
        if not new:
            return
        start = len(self._ids)
        self._reserve(start + len(new))
        self._generation += 1
        self._derived[start:start + len(new)] = np.nan
        self._put_blocks(start, list(new.values()), np.concatenate)
        self._ids.extend(new)
        self._rows.update(zip(new, range(start, start + len(new)), strict=True))
        self._frozen_ids = None
        new.clear()

    def _put_blocks(self, start: int, vectors: Sequence[T],
                    floats: Callable[[Sequence[T]], npt.NDArray[np.float32]]) -> None:
        """Write ``vectors`` into columns ``start…``, ``BLOCK`` at a time; ``floats`` gives a
        block's values, vector after vector. A transposing copy of a whole page at once would
        miss the cache on every element, and joining every blob first would copy them all
        (hence 64 at a time)."""
        for at in range(0, len(vectors), BLOCK):
            block = vectors[at:at + BLOCK]
            rows = unit_rows(floats(block).reshape(len(block), self.dim))
            self._columns[:, start + at:start + at + len(block)] = rows.T

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` vectors: the matrix at least doubles when it grows."""
        have = len(self._ids)
        if rows > self._columns.shape[1]:
            grown = np.zeros((self.dim, max(rows, have * 2)),
                             dtype=np.float32)
            grown[:, :have] = self._columns[:, :have]
            self._columns = grown
            derived = np.full(grown.shape[1], np.nan, np.float32)
            derived[:have] = self._derived[:have]
            self._derived = derived

    def remove(self, memory_id: str) -> None:
        with self._lock:
            self._remove(memory_id)

    def _remove(self, memory_id: str) -> None:
        self._generation += 1
        row = self._rows.pop(memory_id, None)
        if row is None:
            return
        self._frozen_ids = None
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._columns[:, row] = self._columns[:, last]
            self._derived[row] = self._derived[last]
            self._ids[row] = moved
            self._rows[moved] = row
        self._ids.pop()

    def similarities(self, query: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Cosine similarity of ``query`` with every live row, in ``ids`` order."""
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise ValueError(f"query has dim {q.shape[0]}, want {self.dim}")
        sims: npt.NDArray[np.float32] = q @ self._columns[:, : len(self._ids)]
        return sims

    def top_k(self, query: npt.ArrayLike, k: int,
              mask: npt.NDArray[np.bool_] | None = None) -> list[tuple[str, float]]:
        """The ``k`` most similar ids (ties by id), optionally among rows where ``mask`` is True."""
        if not self._ids or k <= 0:
            return []
        sims = self.similarities(query)
        if mask is not None:
            sims = np.where(mask, sims, -np.inf).astype(np.float32)
        k = min(k, len(self._ids))
        part = np.argpartition(-sims, k - 1)[:k]
        hits = [(self._ids[i], float(sims[i])) for i in part if np.isfinite(sims[i])]
        hits.sort(key=lambda hit: (-hit[1], hit[0]))
        return hits
