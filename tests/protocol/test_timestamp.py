"""protocol.timestamp: parsing, the canonical form, and agreement with the plane's string order."""

import calendar

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from protocol.timestamp import (
    EPOCH_CURSOR,
    MAX_NS,
    MIN_NS,
    TimestampError,
    canonical,
    format_autosi,
    format_ns,
    is_canonical,
    parse_ns,
)

S = 1_000_000_000
BASE = calendar.timegm((2026, 6, 1, 12, 34, 56)) * S  # 2026-06-01T12:34:56Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-06-01T12:34:56Z", BASE),
        ("2026-06-01T12:34:56+00:00", BASE),
        ("2026-06-01T12:34:56-00:00", BASE),
        ("2026-06-01T12:34:56z", BASE),
        ("2026-06-01t12:34:56Z", BASE),
        ("2026-06-01 12:34:56Z", BASE),
        ("2026-06-01T12:34:56.1Z", BASE + 100_000_000),
        ("2026-06-01T12:34:56.12Z", BASE + 120_000_000),
        ("2026-06-01T12:34:56.123Z", BASE + 123_000_000),
        ("2026-06-01T12:34:56.1234Z", BASE + 123_400_000),
        ("2026-06-01T12:34:56.12345Z", BASE + 123_450_000),
        ("2026-06-01T12:34:56.123456+00:00", BASE + 123_456_000),
        ("2026-06-01T12:34:56.1234567Z", BASE + 123_456_700),
        ("2026-06-01T12:34:56.12345678Z", BASE + 123_456_780),
        ("2026-06-01T12:34:56.123456789+00:00", BASE + 123_456_789),
        ("2026-06-01T12:34:56.000000001Z", BASE + 1),
        ("2026-06-01T18:04:56+05:30", BASE),
        ("2026-06-01T04:34:56.5-08:00", BASE + 500_000_000),
        (
            "2026-06-01T23:59:59.999999999-23:59",
            calendar.timegm((2026, 6, 2, 23, 58, 59)) * S + 999_999_999,
        ),
        ("1970-01-01T00:00:00Z", 0),
        ("1969-12-31T23:59:59.999999999Z", -1),
        ("2024-02-29T00:00:00Z", calendar.timegm((2024, 2, 29, 0, 0, 0)) * S),
        ("0001-01-01T00:00:00Z", MIN_NS),
        ("9999-12-31T23:59:59.999999999Z", MAX_NS),
    ],
)
def test_parse_forms(text: str, expected: int) -> None:
    assert parse_ns(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "2026-13-01T00:00:00Z",
        "2026-00-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2025-02-29T00:00:00Z",
        "2026-01-00T00:00:00Z",
        "2026-01-01T00:00:00",  # no offset
        "2026-01-01T00:00:00.1234567890Z",  # 10 fraction digits
        "2026-01-01T00:00:00.Z",
        "2026-01-01T24:00:00Z",
        "2026-01-01T00:60:00Z",
        "2026-01-01T00:00:60Z",  # leap second
        "2026-01-01T00:00:00+24:00",
        "2026-01-01T00:00:00+05:60",
        "2026-01-01T00:00:00+0530",
        "2026-01-01T00:00:00Z\n",
        " 2026-01-01T00:00:00Z",
        "2026-1-01T00:00:00Z",
        "0000-01-01T00:00:00Z",
        "0001-01-01T00:00:00+00:01",  # before year 1 once the offset is applied
        "9999-12-31T23:59:59-00:01",  # after year 9999 once the offset is applied
        "２０２６-01-01T00:00:00Z",  # full-width digits
        "2026-01-01T00:00:00UTC",
    ],
)
def test_rejects(text: str) -> None:
    with pytest.raises(TimestampError) as info:
        parse_ns(text)
    assert repr(text[:64]) in str(info.value)


def test_error_message_truncates_input() -> None:
    text = "x" * 200
    with pytest.raises(TimestampError) as info:
        parse_ns(text)
    assert repr("x" * 64) in str(info.value)
    assert "x" * 65 not in str(info.value)


@pytest.mark.parametrize(
    ("ns", "canon", "autosi"),
    [
        (0, "1970-01-01T00:00:00.000000000+00:00", "1970-01-01T00:00:00+00:00"),
        (-1, "1969-12-31T23:59:59.999999999+00:00", "1969-12-31T23:59:59.999999999+00:00"),
        (-S, "1969-12-31T23:59:59.000000000+00:00", "1969-12-31T23:59:59+00:00"),
        (BASE, "2026-06-01T12:34:56.000000000+00:00", "2026-06-01T12:34:56+00:00"),
        (
            BASE + 120_000_000,
            "2026-06-01T12:34:56.120000000+00:00",
            "2026-06-01T12:34:56.120+00:00",
        ),
        (
            BASE + 123_456_000,
            "2026-06-01T12:34:56.123456000+00:00",
            "2026-06-01T12:34:56.123456+00:00",
        ),
        (BASE + 1_000, "2026-06-01T12:34:56.000001000+00:00", "2026-06-01T12:34:56.000001+00:00"),
        (
            BASE + 123_456_789,
            "2026-06-01T12:34:56.123456789+00:00",
            "2026-06-01T12:34:56.123456789+00:00",
        ),
        (MIN_NS, "0001-01-01T00:00:00.000000000+00:00", "0001-01-01T00:00:00+00:00"),
        (MAX_NS, "9999-12-31T23:59:59.999999999+00:00", "9999-12-31T23:59:59.999999999+00:00"),
    ],
)
def test_format(ns: int, canon: str, autosi: str) -> None:
    assert format_ns(ns) == canon
    assert format_autosi(ns) == autosi
    assert is_canonical(canon)
    assert parse_ns(autosi) == ns


@pytest.mark.parametrize("ns", [MIN_NS - 1, MAX_NS + 1])
def test_format_out_of_range(ns: int) -> None:
    with pytest.raises(TimestampError):
        format_ns(ns)
    with pytest.raises(TimestampError):
        format_autosi(ns)


def test_epoch_cursor() -> None:
    assert parse_ns(EPOCH_CURSOR) == 0
    assert canonical(EPOCH_CURSOR) == "1970-01-01T00:00:00.000000000+00:00"
    assert not is_canonical(EPOCH_CURSOR)


def test_z_sorts_above_fractions_of_the_same_second() -> None:
    # Why the canonical form never uses Z (contract §2.4): as strings, the plane's epoch cursor
    # is *after* every stamp in the first second of 1970.
    assert format_ns(1_000) < EPOCH_CURSOR
    assert format_autosi(500_000_000) < EPOCH_CURSOR
    assert format_ns(S) > EPOCH_CURSOR


@pytest.mark.parametrize(
    "text",
    ["2026-06-01T12:34:56Z", "2026-06-01T12:34:56.123+00:00", "2026-06-01T12:34:56.123456789", "x"],
)
def test_is_canonical_false(text: str) -> None:
    assert not is_canonical(text)


instants = st.integers(MIN_NS, MAX_NS)


@st.composite
def plane_like(draw: st.DrawFn) -> int:
    """Instants biased to the cases AutoSi treats differently: whole s/ms/µs, and neighbours."""
    ns = draw(instants)
    unit = draw(st.sampled_from([1, 1_000, 1_000_000, S]))
    return max(MIN_NS, min(MAX_NS, ns - ns % unit + draw(st.integers(-1, 1))))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[int, int]:
    """Pairs that are often within the same second, so fraction digits decide the order."""
    a = draw(plane_like())
    if draw(st.booleans()):
        return a, draw(plane_like())
    b = a + draw(st.sampled_from([0, 1, -1, 1_000, -1_000, 1_000_000, -1_000_000, 999, -999]))
    return a, max(MIN_NS, min(MAX_NS, b))


@given(instants)
def test_round_trip(ns: int) -> None:
    text = format_ns(ns)
    assert parse_ns(text) == ns
    assert is_canonical(text)
    assert parse_ns(format_autosi(ns)) == ns
    assert canonical(format_autosi(ns)) == text


@given(pairs())
def test_canonical_string_order_is_instant_order(pair: tuple[int, int]) -> None:
    a, b = pair
    assert (format_ns(a) < format_ns(b)) == (a < b)
    assert (format_ns(a) == format_ns(b)) == (a == b)


@given(pairs())
def test_autosi_vs_canonical_keeps_strict_order(pair: tuple[int, int]) -> None:
    a, b = pair
    assume(a != b)
    assert (format_autosi(a) < format_ns(b)) == (a < b)
    assert (format_autosi(a) < format_autosi(b)) == (a < b)


@given(plane_like())
def test_same_instant_autosi_sorts_below_canonical(ns: int) -> None:
    # The one place mixed forms disagree with instant order: the same instant gives two
    # strings, and the AutoSi one is lower unless it needed all 9 digits.
    autosi, canon = format_autosi(ns), format_ns(ns)
    if ns % 1_000:
        assert autosi == canon
    else:
        assert autosi < canon
