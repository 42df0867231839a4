"""``float32_rows`` gives exactly ``struct``'s bytes, or None whenever ``struct`` would refuse
a value or a value is not finite in float32 (the caller then packs with ``struct``)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_store.floats import float32_rows

ODD = st.one_of(
    st.floats(), st.integers(-(2**70), 2**70), st.booleans(), st.text(max_size=12),
    st.builds(np.float32, st.floats(width=32)), st.builds(np.float64, st.floats()),
    st.sampled_from([float("nan"), float("inf"), -0.0, 5e-324, 3.5e38, 1e300, None]))
FLOATS = st.floats(-3.4e38, 3.4e38)


def by_struct(rows: list[list[object]], dim: int) -> bytes | None:
    packer = struct.Struct(f"<{dim}f")
    try:
        packed = b"".join([packer.pack(*row) for row in rows])
    except (struct.error, TypeError, OverflowError):
        return None
    return packed if np.isfinite(np.frombuffer(packed, dtype="<f4")).all() else None


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([1, 2, 15, 16, 17, 384]), st.integers(0, 40),
       st.floats(0, 0.2))
def test_same_bytes_as_struct_or_none(data: st.DataObject, dim: int, n: int,
                                      odd_share: float) -> None:
    value = st.one_of(FLOATS, ODD) if data.draw(st.floats(0, 1)) < odd_share else FLOATS
    rows = data.draw(st.lists(st.lists(value, min_size=dim, max_size=dim), min_size=n,
                              max_size=n))
    if n and data.draw(st.booleans()) and data.draw(st.floats(0, 1)) < 0.1:
        rows[-1] = rows[-1][:-1]  # a row one short
    expected = by_struct(rows, dim) if all(len(r) == dim for r in rows) else None
    got = float32_rows(rows, dim)  # type: ignore[arg-type]
    if got is not None:
        assert got.dtype == np.dtype("<f4") and got.flags.c_contiguous
        assert got.shape == (n, dim)
        assert got.tobytes() == expected
    plain = all(type(v) is float for row in rows for v in row)
    if expected is not None and plain:
        assert got is not None  # the fast path takes every page of plain, finite floats


@pytest.mark.parametrize(("dim", "n"), [(1, 70_000), (384, 1000), (3, 0)])
def test_headers_of_every_size(dim: int, n: int) -> None:
    """Chunks of more than 65,535 rows (5-byte array header), of 16+ and of under 16."""
    rng = np.random.default_rng(dim)
    rows = rng.standard_normal((n, dim)).tolist()
    got = float32_rows(rows, dim)
    assert got is not None
    assert got.tobytes() == by_struct(rows, dim)


@pytest.mark.parametrize("odd", [2**40, -(2**40), 2**63 + 5, True, np.float32(0.5), "0.5"])
def test_a_value_of_another_type_never_passes_as_a_float(odd: object) -> None:
    """A 9-byte msgpack int has a float64's length: only its marker tells them apart."""
    rows: list[list[object]] = [[0.25] * 16 for _ in range(3)]
    rows[1][7] = odd
    got = float32_rows(rows, 16)  # type: ignore[arg-type]
    assert got is None or got.tobytes() == by_struct(rows, 16)
    assert float32_rows([[0.25] * 16 for _ in range(3)], 16) is not None
