"""protocol.hlc: monotonicity, causality, the drift guard and node separation."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.hlc import DEFAULT_MAX_DRIFT_NS, HybridClock
from protocol.timestamp import format_ns, is_canonical, parse_ns

S = 1_000_000_000
T0 = parse_ns("2026-06-01T12:00:00Z")
HOUR = 3600 * S


class FakeWall:
    """An injected wall clock: returns ``now`` until a test moves it."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize("node", [-1, 1000, 10_000])
def test_node_out_of_range(node: int) -> None:
    with pytest.raises(ValueError, match="node"):
        HybridClock(node)


def test_stamps_follow_the_wall_and_carry_the_node() -> None:
    wall = FakeWall(T0 + 123_456_789)
    clock = HybridClock(42, wall=wall)
    assert clock.node == 42
    assert clock.now() == "2026-06-01T12:00:00.123456042+00:00"
    wall.now += S
    assert clock.now_ns() == T0 + S + 123_456_042
    assert clock.last_ns == T0 + S + 123_456_042


def test_default_wall_is_real_time() -> None:
    stamp = parse_ns(HybridClock(1).now())
    assert stamp % 1000 == 1
    assert stamp > parse_ns("2020-01-01T00:00:00Z")


def test_offset_is_added_to_the_wall() -> None:
    clock = HybridClock(0, wall=FakeWall(T0), offset_ns=-HOUR)
    assert clock.physical_ns() == T0 - HOUR
    clock.offset_ns = 2 * S
    assert clock.physical_ns() == T0 + 2 * S
    assert clock.now_ns() == T0 + 2 * S


def test_monotonic_when_the_wall_steps_back_ten_minutes() -> None:
    wall = FakeWall()
    clock = HybridClock(7, wall=wall)
    before = [clock.now() for _ in range(5)]
    wall.now -= 10 * 60 * S
    after = [clock.now() for _ in range(5)]
    stamps = before + after
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)


def test_strictly_increasing_with_a_frozen_wall() -> None:
    clock = HybridClock(3, wall=FakeWall())
    stamps = [clock.now() for _ in range(10_000)]
    assert all(a < b for a, b in itertools.pairwise(stamps))
    assert all(is_canonical(s) for s in stamps)


def test_receive_then_now_is_greater() -> None:
    clock = HybridClock(5, wall=FakeWall())
    remote = format_ns(T0 + 60 * S + 999)  # a minute ahead, node 999: within the drift
    assert clock.receive(remote)
    assert clock.last_ns == parse_ns(remote)
    assert clock.now() > remote
    assert clock.drift_rejections == 0


def test_receive_of_an_older_stamp_changes_nothing() -> None:
    clock = HybridClock(5, wall=FakeWall())
    mine = clock.now_ns()
    assert clock.receive(mine - HOUR)
    assert clock.last_ns == mine


def test_far_future_stamp_is_ignored_and_counted() -> None:
    wall = FakeWall()
    clock = HybridClock(5, wall=wall)
    future = T0 + 24 * HOUR
    assert not clock.receive(future)
    assert not clock.receive(format_ns(T0 + DEFAULT_MAX_DRIFT_NS + 1))
    assert clock.drift_rejections == 2
    assert clock.now_ns() < future
    assert clock.receive(T0 + DEFAULT_MAX_DRIFT_NS)  # exactly at the limit is accepted


def test_clocks_with_different_nodes_never_collide() -> None:
    wall = FakeWall()
    a, b = HybridClock(1, wall=wall), HybridClock(2, wall=wall)
    sa = {a.now() for _ in range(1000)}
    sb = {b.now() for _ in range(1000)}
    assert len(sa) == len(sb) == 1000
    assert not sa & sb


@given(
    last=st.integers(T0 - 10 * HOUR, T0 + 10 * HOUR),
    wall_now=st.integers(T0 - 24 * HOUR, T0 + 24 * HOUR),
    node=st.integers(0, 999),
)
def test_restore_continues_above_last(last: int, wall_now: int, node: int) -> None:
    clock = HybridClock(node, wall=FakeWall(wall_now), last_ns=last)
    assert clock.last_ns == last
    first = clock.now_ns()
    assert first > last
    assert format_ns(first) > format_ns(last)
    assert first % 1000 == node


class SkewedWall:
    """A replica's wall clock: shared real time plus a fixed skew, minus backward stumbles."""

    def __init__(self, real: list[int], skew: int) -> None:
        self.real, self.skew, self.back = real, skew, 0

    def __call__(self) -> int:
        return self.real[0] + self.skew - self.back


# Steps: advance real time; one wall stumbles back up to 1 s; a local event; a message.
steps = st.one_of(
    st.tuples(st.just("advance"), st.integers(0, 10 * 60 * S), st.just(0)),
    st.tuples(st.just("stumble"), st.integers(0, 2), st.integers(0, S)),
    st.tuples(st.just("now"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("send"), st.integers(0, 2), st.integers(0, 2)),
)
# ±1 h less a 2 min margin, so 60 stumbles of 1 s keep every pair within the 2 h guard.
skews = st.integers(-HOUR + 120 * S, HOUR - 120 * S)


@given(skews=st.lists(skews, min_size=3, max_size=3), plan=st.lists(steps, max_size=60))
def test_causality_across_three_skewed_clocks(
    skews: list[int], plan: list[tuple[str, int, int]]
) -> None:
    real = [T0]
    walls = [SkewedWall(real, skew) for skew in skews]
    clocks = [HybridClock(i, wall=walls[i], max_drift_ns=2 * HOUR) for i in range(3)]
    issued: list[list[str]] = [[], [], []]
    for kind, first, second in plan:
        if kind == "advance":
            real[0] += first
        elif kind == "stumble":
            walls[first].back += second
        if kind in ("stumble", "now", "send"):
            issued[first].append(clocks[first].now())
        if kind == "send":
            sent = issued[first][-1]
            assert clocks[second].receive(sent)
            reply = clocks[second].now()
            issued[second].append(reply)
            assert reply > sent
    for stamps in issued:
        assert stamps == sorted(stamps)
        assert len(set(stamps)) == len(stamps)
    everything = [s for stamps in issued for s in stamps]
    assert len(set(everything)) == len(everything)
    assert all(c.drift_rejections == 0 for c in clocks)
