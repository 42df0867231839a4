"""RFC 3339 timestamps as exact integer nanoseconds, and the two string forms syncd emits.

Rules:
1. ``parse_ns`` accepts ``YYYY-MM-DD(T|t| )HH:MM:SS[.f{1,9}](Z|z|±HH:MM)`` and nothing else.
   The fraction is right-padded to nanoseconds and the offset is subtracted, all in integer
   math (no float, no ``datetime.fromisoformat``, which drops the 7th-9th digits).
2. Only years 0001-9999 exist, before and after applying the offset; leap seconds (``:60``)
   are rejected. Every parsed value can therefore be formatted again.
3. The canonical form (``format_ns``) is fixed-width: 9 fraction digits and ``+00:00``,
   never ``Z``. Because every position has a fixed meaning, string order equals instant
   order, and the plane compares timestamps only as strings (contract §1, §2.4).
4. ``format_autosi`` reproduces chrono's ``to_rfc3339()`` (0, 3, 6 or 9 fraction digits), to
   emulate the plane. Against the canonical form it keeps strict order (``+`` sorts below
   ``.`` and below every digit), but the same instant gives two different strings, and the
   AutoSi one sorts lower unless it has 9 digits.
5. ``Z`` sorts above ``.``: ``"...:00Z"`` is after ``"...:00.5+00:00"``. So the plane's
   default cursor ``EPOCH_CURSOR`` is above every canonical stamp in the first second of 1970.
"""

import re
from datetime import date

EPOCH_CURSOR = "1970-01-01T00:00:00Z"

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
MIN_NS = (date.min.toordinal() - _EPOCH_ORDINAL) * NS_PER_DAY
MAX_NS = (date.max.toordinal() - _EPOCH_ORDINAL + 1) * NS_PER_DAY - 1

# re.ASCII: \d must not match non-ASCII digits such as "٢".
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


class TimestampError(ValueError):
    """A string is not an accepted RFC 3339 timestamp, or an instant is out of range."""


def _reject(text: str) -> TimestampError:
    return TimestampError(f"invalid RFC 3339 timestamp: {text[:64]!r}")


def _day_ns(year: int, month: int, day: int) -> int:
    """Nanoseconds from the epoch to midnight UTC of a valid calendar date."""
    return (date(year, month, day).toordinal() - _EPOCH_ORDINAL) * NS_PER_DAY


def parse_ns(text: str) -> int:
    """Parse an RFC 3339 timestamp into integer nanoseconds since the Unix epoch (UTC)."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise _reject(text)
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    sign, off_h, off_m = m.group(8), int(m.group(9) or 0), int(m.group(10) or 0)
    if hour > 23 or minute > 59 or second > 59 or off_h > 23 or off_m > 59:
        raise _reject(text)
    try:
        midnight = _day_ns(year, month, day)
    except ValueError:
        raise _reject(text) from None
    offset = (off_h * 3600 + off_m * 60) * (-1 if sign == "-" else 1)
    seconds = hour * 3600 + minute * 60 + second - offset
    ns = midnight + seconds * NS_PER_SECOND + int((m.group(7) or "").ljust(9, "0"))
    if not MIN_NS <= ns <= MAX_NS:
        raise _reject(text)
    return ns


def _split(ns: int) -> tuple[str, int]:
    """``YYYY-MM-DDTHH:MM:SS`` (UTC) and the nanoseconds within that second."""
    if not MIN_NS <= ns <= MAX_NS:
        raise TimestampError(f"instant out of range (years 1-9999): {ns} ns")
    days, in_day = divmod(ns, NS_PER_DAY)  # floor division: works before 1970 too
    d = date.fromordinal(days + _EPOCH_ORDINAL)
    seconds, nanos = divmod(in_day, NS_PER_SECOND)
    hour, rest = divmod(seconds, 3600)
    minute, second = divmod(rest, 60)
    head = f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return head, nanos


def format_ns(ns: int) -> str:
    """The canonical form: ``YYYY-MM-DDTHH:MM:SS.fffffffff+00:00``."""
    head, nanos = _split(ns)
    return f"{head}.{nanos:09d}+00:00"


def format_autosi(ns: int) -> str:
    """What chrono ``to_rfc3339()`` emits (SecondsFormat::AutoSi, ``+00:00``)."""
    head, nanos = _split(ns)
    if nanos == 0:
        return f"{head}+00:00"
    if nanos % 1_000_000 == 0:
        return f"{head}.{nanos // 1_000_000:03d}+00:00"
    if nanos % 1_000 == 0:
        return f"{head}.{nanos // 1_000:06d}+00:00"
    return f"{head}.{nanos:09d}+00:00"


_CANONICAL_SHAPE = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}\+00:00", re.ASCII)


def canonical(text: str) -> str:
    """Rewrite any accepted timestamp into the canonical form.

    Fast path: a string already in canonical shape only needs its fields range-checked.
    """
    if _CANONICAL_SHAPE.fullmatch(text):
        if _valid_day(text[:10]) and text[11:13] < "24" and text[14:16] < "60" and (
                text[17:19] < "60"):
            return text
        raise _reject(text)
    return format_ns(parse_ns(text))


_DAYS_SEEN: dict[str, bool] = {}


def _valid_day(day: str) -> bool:
    """Is ``YYYY-MM-DD`` a real date? Memoised: a sync batch spans few distinct days."""
    known = _DAYS_SEEN.get(day)
    if known is None:
        try:
            date(int(day[0:4]), int(day[5:7]), int(day[8:10]))
            known = True
        except ValueError:
            known = False
        if len(_DAYS_SEEN) < 100_000:
            _DAYS_SEEN[day] = known
    return known


def is_canonical(text: str) -> bool:
    """True when ``text`` is already exactly in the canonical form."""
    try:
        return canonical(text) == text
    except TimestampError:
        return False
