"""The rows of an export file (``{"memory_nodes": [...], "memory_edges": [...], ...}``), read a
piece at a time: ``syncd import`` of a 500 MB export must not hold the whole file as Python
objects (~3 GB with 384 floats a row).

Rules:
  * ``rows`` yields ``(key, index, row)`` for each element of the top-level object's
    ``memory_nodes`` and ``memory_edges`` arrays, in file order; any other key's value is read
    and dropped. A missing array is empty, ``null`` too — as the plane's import reads a body —
    unless ``require_an_array``: a file to import holding neither is not an export (the wrong
    file, a misspelt key), whose rows would be dropped without a word.
  * Anything else — not JSON, not an object, an array key holding another type, data after the
    object, a value nested deeper than ``json`` reads (about a thousand levels: its recursion
    limit) — is ``ValueError`` naming what and where (a character offset), raised when
    reached: read a file through once (``count_rows``) before acting on its rows.
  * Each value is parsed by ``json``'s own decoder, so it means exactly what ``json.loads``
    makes of it. A value is accepted only once a character that cannot continue a number
    follows it in the buffer (or the file has ended): a number cut by the buffer's end is never
    taken for a shorter one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TextIO

ARRAYS = ("memory_nodes", "memory_edges")
EXPORT_SHAPE = "an object with memory_nodes and memory_edges"
CHUNK_CHARS = 1 << 20
_SPACE = " \t\n\r"
_NUMBER_GOES_ON = re.compile(r"[0-9.eE+-]*\Z")  # only such characters up to the piece's end


def rows(handle: TextIO, chunk: int = CHUNK_CHARS, *, require_an_array: bool = False,
         others: dict[str, object] | None = None) -> Iterator[tuple[str, int, object]]:
    """The rows (module docstring); with ``others``, every other top-level key's value goes
    there (a ``changes`` page's ``until``, ``has_more``, ...)."""
    reader = _Reader(handle, chunk)
    reader.expect("{", EXPORT_SHAPE)
    found = False
    if reader.peek() == "}":
        reader.pos += 1
    else:
        while True:
            reader.peek()
            at = reader.offset
            key = reader.value()
            if not isinstance(key, str):
                raise ValueError(f"expected a key (a string) at character {at}")
            reader.expect(":", "':'")
            found = found or key in ARRAYS
            if key in ARRAYS and reader.peek() == "[":
                reader.pos += 1
                yield from _elements(reader, key)
            else:
                value = reader.value()
                if key in ARRAYS and value is not None:
                    raise ValueError(f"{key} must be a list of rows, got {_type(value)}")
                if others is not None and key not in ARRAYS:
                    others[key] = value
            if not reader.separator("}"):
                break
    if reader.peek():
        raise ValueError(f"extra data after the object at character {reader.offset}")
    if require_an_array and not found:
        raise ValueError(f"expected {EXPORT_SHAPE}, found an object with neither")


def count_rows(handle: TextIO, chunk: int = CHUNK_CHARS, *,
               require_an_array: bool = False) -> dict[str, int]:
    """Rows per array: reads the whole file through, so a file ``rows`` would fail on part
    way fails here, before anything is done with it."""
    counts = dict.fromkeys(ARRAYS, 0)
    for key, _, _ in rows(handle, chunk, require_an_array=require_an_array):
        counts[key] += 1
    return counts


def _elements(reader: _Reader, key: str) -> Iterator[tuple[str, int, object]]:
    if reader.peek() == "]":
        reader.pos += 1
        return
    index = 0
    while True:
        yield key, index, reader.value()
        index += 1
        if not reader.separator("]"):
            return


def _type(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "int", float: "number"}.get(type(value), type(value).__name__)


class _Reader:
    def __init__(self, handle: TextIO, chunk: int) -> None:
        self.handle, self.chunk = handle, chunk
        self.buf, self.pos, self.dropped, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()

    @property
    def offset(self) -> int:
        return self.dropped + self.pos

    def more(self) -> bool:
        """Read the next piece (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        data = self.handle.read(self.chunk)
        if not data:
            self.eof = True
            return False
        self.dropped += self.pos
        self.buf, self.pos = self.buf[self.pos:] + data, 0
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end), not consumed."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _SPACE:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, char: str, what: str) -> None:
        found = self.peek()
        if found != char:
            raise ValueError(f"expected {what} at character {self.offset}, found "
                             f"{repr(found) if found else 'the end of the file'}")
        self.pos += 1

    def separator(self, closing: str) -> bool:
        """After a member: True after a ',' (another follows), False after ``closing``."""
        found = self.peek()
        if found == ",":
            self.pos += 1
            return True
        self.expect(closing, f"',' or '{closing}'")
        return False

    def value(self) -> object:
        if not self.peek():
            raise ValueError(f"the file ends early, at character {self.offset}")
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue
                where = self.dropped + exc.pos
                if not self.buf[exc.pos:].strip():
                    raise ValueError(f"the file ends early, at character {where}") from None
                raise ValueError(f"not JSON at character {where}: {exc.msg}") from None
            except RecursionError:  # json's decoder recurses once per level of nesting
                raise ValueError(f"the value at character {self.offset} is nested too deeply "
                                 "to read (no export row is)") from None
            # "0." at a piece's end parses as 0: a value is taken once something that cannot
            # continue a number follows it (or the file has ended)
            if not _NUMBER_GOES_ON.match(self.buf, end) or not self.more():
                self.pos = end
                return value
