"""The apply path's shortcuts give what the plain computation gives.

``node_batches`` tries each row against the previous row's NULL pattern before working the
pattern out; ``blob_view`` binds a vector's own buffer when it already is what ``to_blob`` would
copy out. Both are checked against the plain computation on varied input.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from local_store.columns import NODE_COLUMNS, node_batches
from local_store.embed import blob_view, to_blob


class EqualsEverything:
    """A value that says it equals anything, None included (``None in row`` is then True)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def plain_batches(rows: list[dict[str, object]]) -> dict[tuple[bool, ...], list[tuple[object, ...]]]:
    groups: dict[tuple[bool, ...], list[tuple[object, ...]]] = {}
    for row in rows:
        values = [row[name] for name in NODE_COLUMNS]
        nulls = tuple(value is None for value in values)
        groups.setdefault(nulls, []).append(tuple(v for v in values if v is not None))
    return groups


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("upsert", [False, True])
def test_node_batches_group_rows_as_the_plain_computation(seed: int, upsert: bool) -> None:
    rng = random.Random(seed)
    optional = [name for name in NODE_COLUMNS if name != "id"]
    patterns = [frozenset(rng.sample(optional, rng.randint(0, 12))) for _ in range(4)]
    rows = []
    for i in range(400):
        # runs of one pattern, as a page from one writer has, broken now and then
        nulls = patterns[0] if rng.random() < 0.8 else rng.choice(patterns)
        row: dict[str, object] = {}
        for name in NODE_COLUMNS:
            if name in nulls:
                row[name] = None
            else:
                row[name] = rng.choice([f"{name}-{i}", 0, 0.0, "", False])
        if rng.random() < 0.05:  # now and then, a value that claims to equal None
            row[rng.choice([n for n in NODE_COLUMNS if n not in nulls])] = EqualsEverything()
        rows.append(row)
    got = node_batches(rows, upsert=upsert)
    want = plain_batches(rows)
    assert len(got) == len(want)
    by_sql = {sql: params for sql, params in got}
    assert sum(len(params) for params in by_sql.values()) == len(rows)
    for nulls, params in want.items():  # the same values, by identity, in the same order
        assert any(identical(batch, params) for batch in by_sql.values()), nulls


def identical(a: list[tuple[object, ...]], b: list[tuple[object, ...]]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(u is v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("vector", [
    np.arange(6, dtype="<f4"),
    np.arange(6, dtype=">f4"),
    np.arange(12, dtype="<f4")[::2],
    np.arange(6, dtype=np.float64),
    np.arange(12, dtype="<f4").reshape(2, 6)[1],
])
def test_blob_view_holds_the_bytes_to_blob_copies(vector: np.ndarray) -> None:
    assert bytes(blob_view(vector)) == to_blob(vector)
