"""The in-RAM vector index: exact top-k against a brute-force reference, growth, removal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_store.vectors import BLOCK, VectorIndex, nearest_rows


def unit(rng: np.random.Generator, n: int, dim: int = 8) -> np.ndarray:
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_top_k_matches_brute_force_after_growth_and_removals() -> None:
    rng = np.random.default_rng(7)
    index = VectorIndex("m", 8, capacity=2)
    vectors = {f"id{i:03d}": v for i, v in enumerate(unit(rng, 300))}
    for mid, v in vectors.items():
        index.upsert(mid, v)
    for mid in list(vectors)[::3]:
        index.remove(mid)
        del vectors[mid]
    index.remove("never-there")
    query = unit(rng, 1)[0]
    expected = sorted(vectors, key=lambda mid: -float(vectors[mid] @ query))[:10]
    assert [mid for mid, _ in index.top_k(query, 10)] == expected
    assert len(index) == len(vectors) == 200


def test_upsert_replaces_and_mask_filters() -> None:
    index = VectorIndex("m", 2)
    index.upsert("a", [1.0, 0.0])
    index.upsert("b", [0.0, 1.0])
    index.upsert("a", [0.0, 1.0])
    assert index.top_k([0.0, 1.0], 5) == [("a", 1.0), ("b", 1.0)]
    assert index.top_k([0.0, 1.0], 5, mask=np.array([False, True])) == [("b", 1.0)]
    with pytest.raises(ValueError, match="dim 3"):
        index.upsert("c", [1.0, 0.0, 0.0])
    assert VectorIndex("m", 2).top_k([1.0, 0.0], 3) == []


def test_snapshot_is_consistent_while_another_thread_writes() -> None:
    """Recall snapshots on its own thread while the loop upserts and removes (swap-with-last):
    every (id, cosine) pair in a snapshot must belong together."""
    import threading

    dim = 16
    index = VectorIndex("m", dim, capacity=4)
    query = np.zeros(dim, dtype=np.float32)
    query[0] = 1.0

    def vector(n: int) -> np.ndarray:
        """A unit vector (the index holds unit rows) whose cosine with the query encodes n:
        -0.998 + 0.004·n, so any two ids differ by 0.004."""
        cosine = -0.998 + 0.004 * n
        v = np.zeros(dim, dtype=np.float32)
        v[0], v[1 + n % (dim - 1)] = cosine, np.sqrt(1.0 - cosine * cosine)
        return v

    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:  # churns 500 ids: inserts, updates, and swap-with-last removals
        n = 0
        while not stop.is_set():
            index.upsert(f"id{n % 500}", vector(n % 500))
            index.remove(f"id{(n * 7) % 500}")
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(300):
            ids, sims = index.snapshot(query)
            if len(ids) != len(sims):
                errors.append("length mismatch")
            for mid, sim in zip(ids, sims, strict=False):
                n = int(mid[2:])
                if abs(float(sim) - float(vector(n) @ query)) > 1e-5:
                    errors.append(f"{mid} carries another row's vector")
                    break
    finally:
        stop.set()
        thread.join()
    assert errors == []


@pytest.mark.parametrize("values", ["distinct", "ties", "nan"])
def test_nearest_rows_is_argpartitions_set(values: str) -> None:
    """The fast top-k picks exactly the rows ``np.argpartition(-sims, k - 1)[:k]`` picks, also
    when the k-th value is tied across the cut (few distinct values) or rows are NaN."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 5000))
        sims = rng.standard_normal(n).astype(np.float32)
        if values == "ties":
            sims = np.round(sims * rng.integers(1, 20)).astype(np.float32)
        elif values == "nan":
            sims[rng.random(n) < rng.random()] = np.nan
        for k in {1, 50, 100, 800, int(rng.integers(1, n + 1))}:
            k = min(k, n)
            expected = np.arange(n) if k >= n else np.argpartition(-sims, k - 1)[:k]
            got = nearest_rows(sims, k)
            assert sorted(got.tolist()) == sorted(expected.tolist()), (trial, n, k)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans(), st.integers(0, 1)), max_size=40),
       st.lists(st.integers(0, 12), max_size=8), st.integers(1, 16))
def test_apply_equals_one_change_at_a_time(changes: list[tuple[int, bool, int]],
                                           held: list[int], capacity: int) -> None:
    """``apply`` appends runs of new ids as one block; the result must be what upserting and
    removing one change at a time gives: an id added then removed in one batch is gone, an id
    sent twice keeps its last vector, a wrong-width vector removes the id."""
    rng = np.random.default_rng(len(changes))
    batch: list[tuple[str, np.ndarray | None]] = []
    for key, remove, width in changes:
        vector = rng.standard_normal(4 if width else 3).astype(np.float32)
        batch.append((f"id{key}", None if remove else vector))
    bulk, single = VectorIndex("m", 4, capacity=capacity), VectorIndex("m", 4, capacity=capacity)
    for key in held:
        vector = rng.standard_normal(4).astype(np.float32)
        bulk.upsert(f"id{key}", vector)
        single.upsert(f"id{key}", vector)
    bulk.apply(batch)
    for mid, values in batch:
        if values is None or values.shape[0] != 4:
            single.remove(mid)
        else:
            single.upsert(mid, values)
    assert sorted(bulk.ids) == sorted(single.ids)
    assert len(set(bulk.ids)) == len(bulk)
    got = {mid: bulk.matrix[row].tolist() for row, mid in enumerate(bulk.ids)}
    want = {mid: single.matrix[row].tolist() for row, mid in enumerate(single.ids)}
    assert got == want
    query = np.ones(4, dtype=np.float32)
    ids, sims = bulk.snapshot(query)
    assert dict(zip(ids, sims.tolist(), strict=True)) == pytest.approx(
        {mid: float(np.asarray(v, dtype=np.float32) @ query) for mid, v in want.items()},
        abs=1e-5)  # float32 sums in another order


@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, 3 * BLOCK + 5])
def test_blocks_of_rows_land_in_their_columns(n: int) -> None:
    """Vectors are columns, written ``BLOCK`` rows at a time: built from blobs and appended in
    one batch onto a held row, every id keeps exactly its own vector, across block edges."""
    rng = np.random.default_rng(n)
    vectors = unit(rng, n, dim=24)
    ids = [f"id{i}" for i in range(n)]
    loaded = VectorIndex.from_rows("m", 24, ids, [v.astype("<f4").tobytes() for v in vectors])
    applied = VectorIndex("m", 24, capacity=2)
    applied.upsert("held", np.ones(24, dtype=np.float32))
    applied.apply(list(zip(ids, vectors, strict=True)))
    for index, offset in ((loaded, 0), (applied, 1)):
        assert index.ids[offset:] == ids
        np.testing.assert_array_equal(index.matrix[offset:], vectors)
        query = unit(rng, 1, dim=24)[0]
        _, sims = index.snapshot(query)
        np.testing.assert_allclose(sims[offset:], vectors.astype(np.float64) @ query, atol=1e-6)


def test_from_rows_refuses_a_count_mismatch() -> None:
    blob = np.zeros(4, dtype="<f4").tobytes()
    with pytest.raises(ValueError, match="2 ids but 1 vectors"):
        VectorIndex.from_rows("m", 4, ["a", "b"], [blob])
    with pytest.raises(ValueError):  # a blob of the wrong width
        VectorIndex.from_rows("m", 4, ["a"], [blob + blob])


def unit_vectors(n: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_cosines_come_from_the_snapshot_and_are_computed_for_moved_rows() -> None:
    vectors = unit_vectors(6)
    index = VectorIndex("m", 16)
    for i, v in enumerate(vectors):
        index.upsert(f"memory:{i}", v)
    query = vectors[0]
    snapshot = index.snapshot(query)
    index.remove("memory:1")  # memory:5 moves into its row after the snapshot
    got = index.cosines(["memory:2", "memory:5", "memory:1", "memory:9"], query, snapshot)
    assert set(got) == {"memory:2", "memory:5"}  # removed and unknown ids have none
    for mid in got:
        assert got[mid] == pytest.approx(float(vectors[int(mid[-1])] @ query), abs=1e-6)


def test_derived_values_are_kept_until_the_vector_changes_or_moves() -> None:
    vectors = unit_vectors(4)
    index = VectorIndex("m", 16, capacity=2)  # it grows while values are kept
    for i, v in enumerate(vectors):
        index.upsert(f"memory:{i}", v)
    rows_seen: list[int] = []

    def first_element(matrix: np.ndarray) -> np.ndarray:
        rows_seen.append(len(matrix))
        return matrix[:, 0].copy()

    def expected(i: int, sign: float = 1.0) -> float:
        return pytest.approx(sign * float(vectors[i][0]))

    got = index.derived(["memory:0", "memory:1"], first_element)
    assert got == {"memory:0": expected(0), "memory:1": expected(1)}
    assert index.derived(["memory:0", "memory:1", "memory:2"], first_element)["memory:2"] == (
        expected(2))
    assert rows_seen == [2, 1]  # the second call computed memory:2 only
    index.upsert("memory:0", -vectors[0])  # a new vector: computed again
    assert index.derived(["memory:0"], first_element)["memory:0"] == expected(0, -1.0)
    assert rows_seen == [2, 1, 1]
    index.remove("memory:1")  # memory:3 moves into its row, without a value yet
    assert index.derived(["memory:3", "memory:2"], first_element) == {
        "memory:3": expected(3), "memory:2": expected(2)}
    assert rows_seen == [2, 1, 1, 1]


def test_fill_derived_computes_every_missing_value_a_block_at_a_time() -> None:
    vectors = unit_vectors(10)
    index = VectorIndex("m", 16)
    index.apply([(f"memory:{i}", v) for i, v in enumerate(vectors)])
    blocks: list[int] = []

    def first_element(matrix: np.ndarray) -> np.ndarray:
        blocks.append(len(matrix))
        return matrix[:, 0].copy()

    index.derived([f"memory:{i}" for i in range(4, 8)], first_element)  # rows 4-7 have one
    assert index.fill_derived(first_element, chunk=4) == 6  # rows 0-3 and 8-9
    assert blocks == [4, 4, 2]
    assert index.fill_derived(first_element, chunk=4) == 0  # nothing left
    got = index.derived([f"memory:{i}" for i in range(10)], first_element)
    assert got == {f"memory:{i}": pytest.approx(float(vectors[i][0])) for i in range(10)}
    assert blocks == [4, 4, 2]  # all read back, none computed
    assert index.fill_derived(first_element, stop=lambda: True) == 0


def test_from_blocks_builds_what_upserts_build() -> None:
    """The index read a cursor's block at a time holds every row in the order read, with room
    for a quarter more than announced, and answers as one built vector by vector; a count
    announced too small only makes it grow."""
    rng = np.random.default_rng(11)
    n = 3000
    vectors = unit(rng, n)
    rows = [(f"id{i:04d}", vectors[i].astype("<f4").tobytes()) for i in range(n)]
    one_by_one = VectorIndex("m", 8, capacity=1)
    for mid, v in zip([r[0] for r in rows], vectors, strict=True):
        one_by_one.upsert(mid, v)
    for count in (n, 10):
        index = VectorIndex.from_blocks("m", 8, count,
                                        (rows[at:at + 77] for at in range(0, n, 77)))
        assert index.ids == [r[0] for r in rows]
        assert np.array_equal(index.matrix, one_by_one.matrix)
        for query in vectors[[0, 123, 1500, 2999]]:  # BLAS may round a column by its place
            assert [m for m, _ in index.top_k(query, 5)] == \
                [m for m, _ in one_by_one.top_k(query, 5)]
            np.testing.assert_allclose(index.similarities(query),
                                       one_by_one.similarities(query), atol=1e-6)
    assert VectorIndex.from_blocks("m", 8, n, iter([rows])).capacity == n * 5 // 4
    assert VectorIndex.from_blocks("m", 8, n, iter([rows]), room=0).capacity == n
