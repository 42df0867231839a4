"""How far a query lies from what a store holds: syncd's second match gate (``recall.py``).

A sentence embedder puts every text somewhere, so the best cosine of a question the store knows
nothing about can reach that of a real paraphrase (MiniLM on ``bench/recall_eval.py``: 0.15–0.42
for off-topic questions, 0.25–0.60 for paraphrases). Where the query lies against *all* the
store's vectors separates them far better: off-topic text sits outside the directions in which
the store's memories vary. The measure is a Mahalanobis distance:

  * fitted on the index's vectors (at most ``FIT_ROWS`` of them, evenly spaced, so a fit costs
    the same at 10k and 100k memories): their mean, and their covariance shrunk towards its
    average variance (``s = trace/dim``: with fewer memories than dimensions the raw covariance
    is singular, and the shrinkage keeps a direction no memory varies in from dominating);
  * scaled by how far an *unseen* memory of the store typically lies: the median distance of
    each half of the sample under the fit of the other half, so the scale does not depend on
    the store's size and spread. On the eval, real queries score 0.72–1.29 (median 1.01) and the
    122 nonsense ones the gate was set on 1.15–1.36 (median 1.27); two blind sets written later
    overlap more: nonsense from 1.03, short real queries up to 1.21.

Below ``MIN_ROWS`` vectors the fit says too little, and there is none (the cosine gate alone
decides). Pure numpy; the index refits lazily when it has grown or shrunk by a tenth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIN_ROWS = 200
FIT_ROWS = 4096
REFIT_SHARE = 0.1  # refit when the number of vectors moved by a tenth since the fit


@dataclass(frozen=True, slots=True)
class Domain:
    """A fitted store: ``strangeness(q)`` is the query's distance over an unseen memory's."""

    mean: npt.NDArray[np.float64]
    whiten: npt.NDArray[np.float64]  # dim × dim: eigenvectors over sqrt(eigenvalue + shrinkage)
    typical: float
    rows: int  # vectors in the index when fitted

    def strangeness(self, query: npt.ArrayLike) -> float:
        centred = np.asarray(query, dtype=np.float64).reshape(-1) - self.mean
        return float(np.linalg.norm(centred @ self.whiten)) / self.typical

    def stale(self, rows: int) -> bool:
        return abs(rows - self.rows) > REFIT_SHARE * self.rows


def sample_rows(rows: int) -> npt.NDArray[np.intp]:
    """Which of ``rows`` vectors a fit reads: at most FIT_ROWS, evenly spaced (deterministic)."""
    return np.linspace(0, rows - 1, min(rows, FIT_ROWS)).astype(np.intp)


def fit_domain(sample: npt.NDArray[np.float32], rows: int) -> Domain | None:
    """The domain of an index of ``rows`` vectors from its ``sample_rows`` (unit vectors, one
    per memory); None below MIN_ROWS. About 0.1 s at FIT_ROWS (three eigendecompositions)."""
    if rows < MIN_ROWS:
        return None
    points = np.asarray(sample, dtype=np.float64)
    points = points[np.isfinite(points).all(axis=1)]  # a NaN vector would poison every mean
    if len(points) < MIN_ROWS:
        return None
    first, second = points[0::2], points[1::2]
    held_out = np.concatenate([_distances(second, *_fit(first)),
                               _distances(first, *_fit(second))])
    mean, whiten = _fit(points)
    return Domain(mean=mean, whiten=whiten, typical=max(float(np.median(held_out)), 1e-12),
                  rows=rows)


def _fit(rows: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64],
                                                  npt.NDArray[np.float64]]:
    mean = rows.mean(axis=0)
    centred = rows - mean
    covariance = centred.T @ centred / len(rows)
    values, vectors = np.linalg.eigh(covariance)
    shrinkage = max(float(np.trace(covariance)) / len(covariance), 1e-12)
    whiten = vectors / np.sqrt(np.maximum(values, 0.0) + shrinkage)
    return mean, whiten


def _distances(rows: npt.NDArray[np.float64], mean: npt.NDArray[np.float64],
               whiten: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    distances: npt.NDArray[np.float64] = np.linalg.norm((rows - mean) @ whiten, axis=1)
    return distances
