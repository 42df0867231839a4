"""Lists of Python floats → one float32 matrix, fast: the vectors of a pulled page.

``struct.pack`` converts one float at a time through the interpreter's argument
tuple. msgspec's msgpack encoder walks the lists in C and writes each float as a
float64 with a one-byte marker (``0xcb`` + 8 big-endian bytes): a fixed layout that numpy reads
in place and narrows to float32 with a C cast — the rounding ``struct``'s ``f`` format uses.
Same bytes.

Anything else in a list (an int, a bool, a numpy scalar, a row of another length) changes the
layout, and a value that is not finite in float32 is refused too: the answer is then None and
the caller packs with ``struct``, which also names what is wrong.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

CHUNK_BYTES = 1 << 20  # encode ~1 MiB at a time: a buffer malloc reuses, no fresh page faults
_FLOAT64 = 0xCB
_ENCODER = msgspec.msgpack.Encoder()


def float32_rows(rows: list[list[float]], dim: int) -> npt.NDArray[np.float32] | None:
    """``rows`` (each exactly ``dim`` Python floats) as a C-contiguous little-endian float32
    matrix, or None when some value is not a float or is not finite in float32.

    The layout check is a proof, not a heuristic: the outer header puts the first row at a
    known offset, its header says ``dim`` elements, and each element found at the next 9-byte
    step starts with the float64 marker, so it is a float64 and the next element starts 9 bytes
    on — by induction every element of every row is a float64."""
    out = np.empty((len(rows), dim), dtype="<f4")
    head = _array_header(dim)
    layout = np.dtype([("head", "u1", (len(head),)),
                       ("cells", [("marker", "u1"), ("value", ">f8")], (dim,))])
    step = max(1, CHUNK_BYTES // layout.itemsize)
    for start in range(0, len(rows), step):
        part = rows[start:start + step]
        try:
            encoded = _ENCODER.encode(part)
        except (TypeError, OverflowError, msgspec.EncodeError):
            return None
        outer = len(encoded) - len(part) * layout.itemsize  # the outer array's own header
        if outer not in (1, 3, 5) or encoded[:outer] != _array_header(len(part)):
            return None
        cells = np.frombuffer(encoded, dtype=layout, offset=outer)
        if (cells["head"] != np.frombuffer(head, dtype=np.uint8)).any() or (
                cells["cells"]["marker"] != _FLOAT64).any():
            return None
        with np.errstate(over="ignore"):  # too large for float32 → inf, refused below
            out[start:start + len(part)] = cells["cells"]["value"]
    return out if np.isfinite(out).all() else None


def _array_header(length: int) -> bytes:
    if length < 16:
        return bytes([0x90 | length])
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")
