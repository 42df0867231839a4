"""A ``changes`` or ``export`` body too large to hold, kept on disk and read a batch at a time.

A Kyma plane ignores ``limit`` and ``cursor`` and answers with its whole feed or store in one
body (contract §4.3): at 100k memories with vectors, ~800 MB of JSON, which decoded whole took
over a gigabyte of Python objects. A body larger than ``SPOOL_FROM`` bytes is written to an
anonymous temporary file as it arrives (``PlaneClient``), and read from there:

  * ``envelope`` reads the file through once, off the event loop, and returns every top-level
    value but the two arrays (``until``, ``has_more``, ...), so the engine decides what to do
    with the page before applying any of it — and a body that is not JSON, or that ends part
    way, fails here, before any of its rows is applied; it counts the rows of each array on
    the way (``counts``), and of the node rows those whose id the store does not hold yet
    (``new_nodes``, with a ``held`` predicate), so the store can make room for the page's new
    vectors once — and none for rows it holds: a Kyma plane sends every row again each pass;
  * ``batches`` then yields its rows, ``SPOOL_ROWS`` at a time, as typed rows plus the rows
    that do not fit the row schema (R5: each costs only itself), nodes before edges as the
    body holds them.

Only one batch of rows is held at a time. The file is removed when closed (or when the process
ends: it has no name).
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Callable, Iterator
from typing import IO, Any

from syncd import jsonrows

SPOOL_FROM = 32 << 20  # bytes: a body up to this is decoded in memory, as before
SPOOL_ROWS = 1000


class Spool:
    """A body on disk (``file``: binary, readable, at any position); see the module rules."""

    def __init__(self, file: IO[bytes], size: int, rows: int = SPOOL_ROWS) -> None:
        self._file, self.size, self._rows = file, size, rows
        self.counts: dict[str, int] = {}  # rows per array, known once ``envelope`` has read it
        self.new_nodes = 0  # node rows whose id ``held`` did not know (``envelope``)

    def close(self) -> None:
        self._file.close()

    async def envelope(self, held: Callable[[object], bool] | None = None) -> dict[str, Any]:
        """Every top-level value but the arrays; ``ValueError`` when the body is not one.
        ``held``: whether the store holds a node row's id (called on the reading thread; a
        hint for ``new_nodes``, nothing else depends on it)."""
        return await asyncio.to_thread(self._envelope, held)

    def _envelope(self, held: Callable[[object], bool] | None) -> dict[str, Any]:
        others: dict[str, object] = {}
        counts: dict[str, int] = {}
        new = 0
        with self._text() as text:
            for key, _, row in jsonrows.rows(text, others=others):
                counts[key] = counts.get(key, 0) + 1
                if key == "memory_nodes" and (held is None or not isinstance(row, dict)
                                              or not held(row.get("id"))):
                    new += 1
        self.counts, self.new_nodes = counts, new
        return others

    async def batches(self) -> AsyncIterator[tuple[str, list[tuple[int, object]]]]:
        """(array key, [(index, raw row), ...]) a batch at a time, each of one array. Nothing
        here refers to a batch once it is handed over: the consumer's references are its
        only ones (it can drop the raw rows once converted, and must drop them before asking
        for the next batch, or two are held at once)."""
        with self._text() as text:
            found = jsonrows.rows(text)
            while True:
                batch = await asyncio.to_thread(_take, found, self._rows)
                if not batch:
                    return
                parts = {key: [(index, row) for k, index, row in batch if k == key]
                         for key in ("memory_nodes", "memory_edges")}
                del batch
                for key in ("memory_nodes", "memory_edges"):
                    if parts[key]:
                        yield key, parts.pop(key)

    def _text(self) -> io.TextIOWrapper:
        self._file.seek(0)
        return _Borrowed(self._file, encoding="utf-8", newline="")


class _Borrowed(io.TextIOWrapper):
    """A text view of the spool's file that leaves the file open when it is done with."""

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _take(found: Iterator[tuple[str, int, object]], n: int) -> list[tuple[str, int, object]]:
    out = []
    for item in found:
        out.append(item)
        if len(out) >= n:
            break
    return out

