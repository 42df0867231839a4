"""Giving freed heap back to the operating system.

glibc keeps what a process frees mapped for reuse: a one-off burst (a model's load, a 100-text
batch, a 30,000-entry JSON document parsed once) stays in the resident set for good otherwise.
``release_freed_memory`` is glibc's ``malloc_trim(0)``; on other C libraries it does nothing
(macOS returns large blocks by itself). It walks the heap (a millisecond or so): call it after
such a burst, never per request.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

_TRIM: list[Callable[[int], int] | None] = []


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Callable[[int], int] | None:
    if not _TRIM:
        found = None
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                found = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        _TRIM.append(found)
    return _TRIM[0]
