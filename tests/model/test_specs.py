"""Unit and property tests for streamsched.specs (pure logic, no broker)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.errors import BoundExceeded, ConfigError, InvalidSpec
from streamsched.model import cron as cron_module
from streamsched.model import limits
from streamsched.model.specs import (
    MAX_BOUNDARY_NS,
    NS_PER_S,
    At,
    CatchUpPlan,
    Cron,
    Every,
    Spec,
    parse_spec,
    plan_catch_up,
)

S = NS_PER_S
MIN = 60 * S
HOUR = 3600 * S
DAY = 86400 * S


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()) * S


def local(zone: str, year: int, month: int, day: int, hour: int, minute: int = 0, fold: int = 0) -> int:
    wall = datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold)
    return int(wall.timestamp()) * S


@dataclass
class FakeClock:
    """A scheduler loop driven by a controllable clock: sleep until the next boundary, fire it."""

    now_ns: int
    fired: list[int] = field(default_factory=list)

    def run(self, spec: Spec, fires: int) -> list[int]:
        for _ in range(fires):
            nxt = spec.next_after(self.now_ns)
            if nxt is None:
                break
            assert nxt > self.now_ns
            self.now_ns = nxt
            self.fired.append(nxt)
        return self.fired

    def advance(self, delta_ns: int) -> None:
        self.now_ns += delta_ns


# --------------------------------------------------------------------------------------------- @every


@pytest.mark.parametrize(
    ("text", "interval_ns"),
    [
        ("@every 1s", S),
        ("@every 30s", 30 * S),
        ("@every 5m", 5 * MIN),
        ("@every 2h", 2 * HOUR),
        ("@every 1d", DAY),
        ("@every 1w", 7 * DAY),
        ("@every 52w", 364 * DAY),
        ("@every 366d", 366 * DAY),
        ("@every 8784h", 366 * DAY),
        ("  @every \t 90m \n", 90 * MIN),
    ],
)
def test_every_parses(text: str, interval_ns: int) -> None:
    assert parse_spec(text) == Every(interval_ns)


def test_every_is_anchored_at_the_epoch() -> None:
    spec = Every(5 * MIN)
    assert spec.next_after(0) == 5 * MIN
    assert spec.next_after(5 * MIN - 1) == 5 * MIN
    assert spec.next_after(5 * MIN) == 10 * MIN
    assert spec.next_after(-1) == 0
    assert spec.next_after(utc(2026, 12, 2, 10, 3, 7)) == utc(2026, 12, 2, 10, 5)
    assert spec.latest_at_or_before(utc(2026, 12, 2, 10, 3, 7)) == utc(2026, 12, 2, 10, 0)
    assert spec.latest_at_or_before(utc(2026, 12, 2, 10, 5)) == utc(2026, 12, 2, 10, 5)


def test_every_with_fake_clock() -> None:
    clock = FakeClock(utc(2026, 1, 1, 0, 0, 1))
    assert clock.run(parse_spec("@every 1h"), 3) == [utc(2026, 1, 1, h) for h in (1, 2, 3)]
    clock.advance(30 * MIN)
    assert parse_spec("@every 1h").next_after(clock.now_ns) == utc(2026, 1, 1, 4)


def test_every_boundaries_and_counts() -> None:
    spec = Every(MIN)
    assert spec.boundaries(0, 5 * MIN, 10) == [MIN, 2 * MIN, 3 * MIN, 4 * MIN, 5 * MIN]
    assert spec.boundaries(0, 5 * MIN, 2) == [MIN, 2 * MIN]
    assert spec.boundaries(0, 5 * MIN, 0) == []
    assert spec.boundaries(MIN, MIN, 10) == []
    assert spec.boundaries(5 * MIN, 0, 10) == []
    assert spec.count_between(0, 5 * MIN) == 5
    assert spec.count_between(0, 5 * MIN - 1) == 4
    assert spec.count_between(-1, 0) == 1
    assert Every(S).count_between(0, 10**9 * S) == 10**9
    with pytest.raises(BoundExceeded):
        spec.boundaries(0, MIN, -1)


def test_every_stays_in_int64() -> None:
    spec = Every(HOUR)
    assert spec.next_after(MAX_BOUNDARY_NS - 1) is None
    last = spec.latest_at_or_before(MAX_BOUNDARY_NS)
    assert last is not None and spec.next_after(last) is None
    assert spec.boundaries(last - HOUR, 10**30, 5) == [last]


@given(
    interval_s=st.integers(min_value=1, max_value=limits.MAX_EVERY_INTERVAL_S),
    t=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_every_next_after_is_on_grid_and_strictly_increasing(interval_s: int, t: int) -> None:
    spec = Every(interval_s * S)
    first = spec.next_after(t)
    assert first is not None
    assert first > t
    assert first % spec.interval_ns == 0
    assert first - t <= spec.interval_ns
    second = spec.next_after(first)
    assert second == first + spec.interval_ns
    assert spec.latest_at_or_before(t) == first - spec.interval_ns
    assert spec.count_between(t, second) == 2


@given(
    interval_s=st.integers(min_value=1, max_value=10_000),
    a=st.integers(min_value=-(10**15), max_value=10**15),
    b=st.integers(min_value=-(10**15), max_value=10**15),
)
def test_every_next_after_is_monotone(interval_s: int, a: int, b: int) -> None:
    spec = Every(interval_s * S)
    lo, hi = min(a, b), max(a, b)
    next_lo, next_hi = spec.next_after(lo), spec.next_after(hi)
    assert next_lo is not None and next_hi is not None and next_lo <= next_hi


# ------------------------------------------------------------------------------------------------ @at


@pytest.mark.parametrize(
    ("text", "at_ns"),
    [
        ("@at 2026-12-02T10:00:00Z", utc(2026, 12, 2, 10)),
        ("@at 2026-12-02t10:00:00z", utc(2026, 12, 2, 10)),
        ("@at 2026-12-02T12:00:00+02:00", utc(2026, 12, 2, 10)),
        ("@at 2026-12-02T04:30:00-05:30", utc(2026, 12, 2, 10)),
        ("@at 2026-12-02T10:00:00-00:00", utc(2026, 12, 2, 10)),
        ("@at 2026-12-03T00:00:00+14:00", utc(2026, 12, 2, 10)),
        ("@at 2026-12-02T10:00:00.5Z", utc(2026, 12, 2, 10) + 500_000_000),
        ("@at 2026-12-02T10:00:00.000000001Z", utc(2026, 12, 2, 10) + 1),
        ("@at 2026-12-02T12:00:00.123456789+02:00", utc(2026, 12, 2, 10) + 123_456_789),
        ("@at 1970-01-01T00:00:00Z", 0),
        ("@at 1969-12-31T23:59:59.999999999Z", -1),
    ],
)
def test_at_normalizes_to_utc_nanoseconds(text: str, at_ns: int) -> None:
    assert parse_spec(text) == At(at_ns)


def test_at_keeps_nanoseconds_where_floats_would_not() -> None:
    spec = parse_spec("@at 2262-04-11T23:47:16.854775807Z")
    assert spec == At(MAX_BOUNDARY_NS)
    assert float(MAX_BOUNDARY_NS) != MAX_BOUNDARY_NS


def test_at_next_after_and_boundaries() -> None:
    at = utc(2026, 12, 2, 10)
    spec = At(at)
    assert spec.next_after(at - 1) == at
    assert spec.next_after(at) is None
    assert spec.latest_at_or_before(at) == at
    assert spec.latest_at_or_before(at - 1) is None
    assert spec.boundaries(at - 1, at, 5) == [at]
    assert spec.boundaries(at, at + DAY, 5) == []
    assert spec.boundaries(at - 1, at, 0) == []
    assert FakeClock(0).run(spec, 3) == [at]


# ----------------------------------------------------------------------------------------------- cron


def test_cron_defaults_to_utc_and_normalizes() -> None:
    spec = parse_spec("0  9 * *   MON-fri")
    assert spec == Cron("0 9 * * mon-fri", "UTC")
    assert isinstance(spec, Cron) and spec.expr == "0 9 * * mon-fri"
    assert hash(spec) == hash(Cron("0 9 * * mon-fri"))
    assert parse_spec("0 9 * * 1-5", timezone="Europe/Berlin") == Cron("0 9 * * 1-5", "Europe/Berlin")


def test_cron_weekdays_in_utc() -> None:
    spec = parse_spec("0 9 * * 1-5")
    friday_noon = utc(2026, 12, 4, 12)
    assert spec.next_after(friday_noon) == utc(2026, 12, 7, 9)
    assert spec.latest_at_or_before(friday_noon) == utc(2026, 12, 4, 9)
    assert FakeClock(friday_noon).run(spec, 3) == [utc(2026, 12, d, 9) for d in (7, 8, 9)]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", utc(2026, 1, 1, 0, 7), [utc(2026, 1, 1, 0, 15), utc(2026, 1, 1, 0, 30)]),
        ("5/20 * * * *", utc(2026, 1, 1), [utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 25)]),
        ("0 0 1 jan,jul *", utc(2026, 2, 1), [utc(2026, 7, 1), utc(2027, 1, 1)]),
        # 7 and 0 are both Sunday; 2026-12-06 is a Sunday.
        ("0 0 * * 7", utc(2026, 12, 1), [utc(2026, 12, 6), utc(2026, 12, 13)]),
        ("0 0 * * sun", utc(2026, 12, 1), [utc(2026, 12, 6), utc(2026, 12, 13)]),
        # Both day fields restricted: the 13th OR a Friday (2026-11-13 is a Friday, 2026-12-13 a Sunday).
        ("0 0 13 * 5", utc(2026, 12, 5), [utc(2026, 12, 11), utc(2026, 12, 13), utc(2026, 12, 18)]),
        # A '*'-prefixed day field switches to AND: odd days that are Mondays.
        ("0 0 */2 * 1", utc(2026, 12, 1), [utc(2026, 12, 7), utc(2026, 12, 21)]),
        ("0 0 29 2 *", utc(2026, 1, 1), [utc(2028, 2, 29), utc(2032, 2, 29)]),
        ("59 23 31 12 *", utc(2026, 12, 31, 23, 59), [utc(2027, 12, 31, 23, 59)]),
    ],
)
def test_cron_next_fire_times(expr: str, after: int, expected: list[int]) -> None:
    spec = parse_spec(expr)
    assert spec.boundaries(after, expected[-1], 100) == expected


def test_cron_boundaries_limit() -> None:
    spec = parse_spec("* * * * *")
    assert spec.boundaries(0, HOUR, 3) == [MIN, 2 * MIN, 3 * MIN]
    assert spec.boundaries(0, HOUR, 0) == []
    with pytest.raises(BoundExceeded):
        spec.boundaries(0, HOUR, -1)


def test_cron_stays_in_int64() -> None:
    spec = parse_spec("0 0 * * *")
    assert spec.next_after(MAX_BOUNDARY_NS - 1) is None
    assert spec.next_after(10**30) is None
    assert spec.next_after(-(10**30)) == utc(1677, 9, 22)
    assert spec.latest_at_or_before(-(10**30)) is None


# -- daylight saving: Europe/Berlin 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z),
#                     2026-10-25 03:00 CEST -> 02:00 CET (01:00Z);
#    America/New_York 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z),
#                     2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).


def test_berlin_gap_fires_once_at_the_transition() -> None:
    spec = parse_spec("30 2 * * *", timezone="Europe/Berlin")
    clock = FakeClock(utc(2026, 3, 27, 12))
    assert clock.run(spec, 3) == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    assert spec.latest_at_or_before(utc(2026, 3, 29, 5)) == utc(2026, 3, 29, 1, 0)


def test_berlin_gap_collapses_several_wall_times_into_one_boundary() -> None:
    spec = parse_spec("*/15 2 * * *", timezone="Europe/Berlin")
    fired = FakeClock(utc(2026, 3, 28, 12)).run(spec, 3)
    assert fired == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 0), utc(2026, 3, 30, 0, 15)]
    # The gap boundary coincides with the 03:00 boundary of an hourly schedule: it fires once.
    hourly = parse_spec("0 * * * *", timezone="Europe/Berlin")
    assert hourly.boundaries(utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 2, 30), 10) == [
        utc(2026, 3, 29, 0),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 29, 2),
    ]


def test_berlin_repeat_fires_once_at_first_occurrence() -> None:
    spec = parse_spec("30 2 * * *", timezone="Europe/Berlin")
    clock = FakeClock(utc(2026, 10, 24, 12))
    first_occurrence = local("Europe/Berlin", 2026, 10, 25, 2, 30, fold=0)
    assert first_occurrence == utc(2026, 10, 25, 0, 30)
    assert clock.run(spec, 2) == [first_occurrence, utc(2026, 10, 26, 1, 30)]
    # Between the two occurrences: the second one (01:30Z) is not a boundary.
    assert spec.next_after(utc(2026, 10, 25, 1)) == utc(2026, 10, 26, 1, 30)
    assert spec.latest_at_or_before(utc(2026, 10, 25, 1, 45)) == first_occurrence


def test_berlin_repeat_half_hourly() -> None:
    spec = parse_spec("*/30 * * * *", timezone="Europe/Berlin")
    fired = spec.boundaries(utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2, 0), 10)
    # 02:00 and 02:30 CEST fire; the repeated 02:00 and 02:30 CET do not; 03:00 CET does.
    assert fired == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 0)]


def test_new_york_gap() -> None:
    spec = parse_spec("30 2 * * *", timezone="America/New_York")
    fired = FakeClock(utc(2026, 3, 7, 12)).run(spec, 2)
    assert fired == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]
    assert fired[0] == local("America/New_York", 2026, 3, 8, 3, 0)


def test_new_york_repeat() -> None:
    spec = parse_spec("30 1 * * *", timezone="America/New_York")
    fired = FakeClock(utc(2026, 10, 31, 12)).run(spec, 2)
    assert fired == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]


def test_new_york_inside_second_occurrence() -> None:
    spec = parse_spec("*/30 * * * *", timezone="America/New_York")
    t = local("America/New_York", 2026, 11, 1, 1, 45, fold=1)
    assert t == utc(2026, 11, 1, 6, 45)
    assert spec.next_after(t) == utc(2026, 11, 1, 7, 0)
    assert spec.latest_at_or_before(t) == utc(2026, 11, 1, 5, 30)
    assert spec.count_between(utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)) == 6


_DST_ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]
_EXPRS = ["* * * * *", "*/7 * * * *", "0 * * * *", "30 2 * * *", "*/15 1-3 * * *", "0 0 * * 0"]
_WINDOWS = [
    (utc(2026, 3, 7), utc(2026, 3, 10)),
    (utc(2026, 3, 28), utc(2026, 3, 31)),
    (utc(2026, 4, 4), utc(2026, 4, 6)),
    (utc(2026, 10, 3), utc(2026, 10, 5)),
    (utc(2026, 10, 24), utc(2026, 10, 27)),
    (utc(2026, 10, 31), utc(2026, 11, 3)),
]


@pytest.mark.parametrize("zone", _DST_ZONES)
def test_cron_count_matches_enumeration_across_transitions(zone: str) -> None:
    for expr in _EXPRS:
        spec = parse_spec(expr, timezone=zone)
        for start, end in _WINDOWS:
            listed = spec.boundaries(start, end, 10**6)
            assert listed == sorted(set(listed))
            assert spec.count_between(start, end) == len(listed), (zone, expr, start)


def test_exotic_transitions_at_midnight_and_a_skipped_day() -> None:
    # Samoa skipped 2011-12-30 entirely (UTC-10 -> UTC+14): its noon fires at the transition.
    apia = parse_spec("0 12 * * *", timezone="Pacific/Apia")
    assert apia.boundaries(utc(2011, 12, 29), utc(2012, 1, 1), 10) == [
        utc(2011, 12, 29, 22),
        utc(2011, 12, 30, 10),
        utc(2011, 12, 30, 22),
        utc(2011, 12, 31, 22),
    ]
    half_hourly = parse_spec("*/30 * * * *", timezone="Pacific/Apia")
    # The whole skipped day collapses onto the transition, which is also 2011-12-31 00:00.
    assert half_hourly.count_between(utc(2011, 12, 29), utc(2012, 1, 1)) == 72 * 2
    # Sao Paulo sprang forward at midnight (2018-11-04) and fell back at midnight (2019-02-17).
    midnight = parse_spec("0 0 * * *", timezone="America/Sao_Paulo")
    assert midnight.next_after(utc(2018, 11, 3, 12)) == utc(2018, 11, 4, 3)
    late = parse_spec("30 23 * * *", timezone="America/Sao_Paulo")
    assert late.boundaries(utc(2019, 2, 16, 12), utc(2019, 2, 19), 10) == [
        utc(2019, 2, 17, 1, 30),
        utc(2019, 2, 18, 2, 30),
    ]
    for spec in (apia, half_hourly, midnight, late):
        for start, end in [(utc(2011, 12, 28), utc(2012, 1, 2)), (utc(2018, 11, 1), utc(2019, 3, 1))]:
            assert spec.count_between(start, end) == len(spec.boundaries(start, end, 10**6))


def test_gap_fires_at_the_transition_when_the_hour_is_a_wildcard() -> None:
    # croniter on a zone-aware start drops these gap wall times (streamsched.model.cron says so);
    # ours fire once at the transition, as for a fixed hour.
    half_past = parse_spec("30 * * * *", timezone="Europe/Berlin")
    assert half_past.boundaries(utc(2026, 3, 29), utc(2026, 3, 29, 2), 10) == [
        utc(2026, 3, 29, 0, 30),  # 01:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: the transition, 03:00 CEST
        utc(2026, 3, 29, 1, 30),  # 03:30 CEST
    ]
    # Lord Howe springs forward 30 minutes (02:00 +10:30 -> 02:30 +11:00 = 15:30Z).
    sevens = parse_spec("*/7 * * * *", timezone="Australia/Lord_Howe")
    assert sevens.boundaries(utc(2026, 10, 3, 15, 20), utc(2026, 10, 3, 15, 40), 10) == [
        utc(2026, 10, 3, 15, 26),  # 01:56
        utc(2026, 10, 3, 15, 30),  # 02:07..02:28 do not exist: the transition
        utc(2026, 10, 3, 15, 35),  # 02:35
    ]


def test_day_of_week_step_runs_to_7_as_in_vixie_cron() -> None:
    # "1/3" is 1-7/3 = Monday, Thursday, Sunday (croniter's own parser reads 1-6/3).
    spec = parse_spec("0 0 * * 1/3")
    assert spec.boundaries(utc(2026, 12, 6), utc(2026, 12, 13), 10) == [
        utc(2026, 12, 7),
        utc(2026, 12, 10),
        utc(2026, 12, 13),
    ]


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("0 0 15W * *", "invalid day-of-month value"),
        ("0 0 * * 5L", "invalid day-of-week value"),
        ("0 0 * * mon#2", "invalid day-of-week value"),
        ("H 0 * * *", "invalid minute value"),
        ("0 0 * * * 2027", "needs 5 fields"),
        ("0 0 0 * * *", "needs 5 fields"),
        ("@hourly", "unknown directive"),
    ],
)
def test_croniter_extensions_are_refused(text: str, reason_part: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(text)
    assert reason_part in info.value.reason


def test_or_with_an_impossible_day_of_month_keeps_the_month() -> None:
    # "Feb 30 OR Monday": the day-of-month side never exists, so February's Mondays fire.
    spec = parse_spec("0 0 30 2 1")
    assert spec.boundaries(utc(2026, 1, 1), utc(2027, 1, 1), 100) == [utc(2026, 2, d) for d in (2, 9, 16, 23)]
    assert spec.latest_at_or_before(utc(2026, 12, 31)) == utc(2026, 2, 23)


@settings(max_examples=60, deadline=None)
@given(
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    expr=st.sampled_from(_EXPRS),
    start=st.integers(min_value=utc(2026, 3, 1), max_value=utc(2026, 11, 30)),
    length=st.integers(min_value=0, max_value=3 * DAY),
)
def test_cron_count_matches_enumeration_random_windows(zone: str, expr: str, start: int, length: int) -> None:
    spec = parse_spec(expr, timezone=zone)
    assert spec.count_between(start, start + length) == len(spec.boundaries(start, start + length, 10**6))


def count_cron_work(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the unit steps of cron arithmetic from now on: wall times croniter walked to
    (``walked``), wall times resolved to instants (``resolved``), boundaries counted one at a
    time rather than a day or an hour at once (``one_by_one``). Counting work, not the wall
    clock, keeps "cheap" a property of the code, not of how busy the machine is."""
    work: Counter[str] = Counter()
    walls, resolve, add = Cron._walls, Cron._resolve, cron_module._Window.add

    def walking(self: Cron, start: datetime, *, backward: bool) -> Iterator[datetime]:
        for wall in walls(self, start, backward=backward):
            work["walked"] += 1
            yield wall

    def resolving(self: Cron, wall: datetime) -> int:
        work["resolved"] += 1
        return resolve(self, wall)

    def adding(self: Any, instant: int) -> None:
        work["one_by_one"] += 1
        add(self, instant)

    monkeypatch.setattr(Cron, "_walls", walking)
    monkeypatch.setattr(Cron, "_resolve", resolving)
    monkeypatch.setattr(cron_module._Window, "add", adding)
    return work


def test_cron_count_over_decades_is_cheap_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec("* * * * *", timezone="Europe/Berlin")
    work = count_cron_work(monkeypatch)
    count = spec.count_between(utc(2000, 1, 1), utc(2026, 1, 1))
    utc_minutes = (utc(2026, 1, 1) - utc(2000, 1, 1)) // MIN
    # Each fall-back hour fires once instead of twice; spring gaps collapse onto the transition.
    assert count == utc_minutes - 26 * 60
    # Cheap: the work follows the days, not the 13.7 M boundaries. Regular days are counted a
    # whole day at a time; wall times are resolved one by one only on the 52 transition days.
    days = (utc(2026, 1, 1) - utc(2000, 1, 1)) // DAY
    assert work["walked"] <= 10  # croniter finds the first and the last boundary, nothing between
    assert work["resolved"] <= days
    assert work["one_by_one"] <= 26 * 2 * 24 * 60


_TRANSITION_TIMES = st.sampled_from(
    [utc(2026, 3, 8, 7), utc(2026, 3, 29, 1), utc(2026, 10, 25, 1), utc(2026, 11, 1, 6)]
)


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(["Europe/Berlin", "America/New_York"]),
    expr=st.sampled_from(_EXPRS),
    center=_TRANSITION_TIMES,
    delta=st.integers(min_value=-3 * HOUR, max_value=3 * HOUR),
)
def test_cron_next_and_latest_are_consistent(zone: str, expr: str, center: int, delta: int) -> None:
    spec = parse_spec(expr, timezone=zone)
    t = center + delta
    nxt = spec.next_after(t)
    latest = spec.latest_at_or_before(t)
    assert nxt is not None and latest is not None
    assert latest <= t < nxt
    assert spec.next_after(latest) == nxt
    assert spec.latest_at_or_before(nxt) == nxt
    assert spec.count_between(latest, nxt) == 1
    following = spec.next_after(nxt)
    assert following is not None and following > nxt


# ------------------------------------------------------------------------------------- invalid specs


@pytest.mark.parametrize(
    ("text", "reason_part"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("x" * 257, "limit is 256"),
        ("@every", "exactly one interval"),
        ("@every 5m 3s", "exactly one interval"),
        ("@every 0s", "positive"),
        ("@every 0m", "positive"),
        ("@every -5m", "without a sign"),
        ("@every +5m", "without a sign"),
        ("@every 05m", "leading zeros"),
        ("@every 1.5h", "whole number"),
        ("@every 5", "no unit"),
        ("@every 5x", "unknown interval unit"),
        ("@every 5S", "unknown interval unit"),
        ("@every 5ms", "unknown interval unit"),
        ("@every 1h30m", "compound intervals"),
        ("@every m", "must look like"),
        ("@every 1mo", "calendar months and years are not intervals"),
        ("@every 1M", "calendar months and years are not intervals"),
        ("@every 1y", "calendar months and years are not intervals"),
        ("@every 2years", "calendar months and years are not intervals"),
        ("@every 367d", "between 1s and 366d"),
        ("@every 53w", "between 1s and 366d"),
        ("@every 8785h", "between 1s and 366d"),
        ("@every 99999999999999999999999999s", "between 1s and 366d"),
        ("@every ５m", "ASCII"),
        ("@every5m", "unknown directive"),
        ("@daily", "unknown directive"),
        ("@at", "exactly one RFC 3339"),
        ("@at 2026-12-02T10:00:00", "no UTC offset"),
        ("@at 2026-12-02T10:00:00.123", "no UTC offset"),
        ("@at 2026-12-02", "not RFC 3339"),
        ("@at 2026-12-02 10:00:00Z", "exactly one RFC 3339"),
        ("@at 2026-12-02T10:00Z", "not RFC 3339"),
        ("@at 2026-12-02T10:00:00+0200", "not RFC 3339"),
        ("@at 2026-12-02T10:00:00.Z", "not RFC 3339"),
        ("@at 1733133600", "not RFC 3339"),
        ("@at tomorrow", "not RFC 3339"),
        ("@at 2026-12-02T10:00:00.1234567891Z", "finer than nanoseconds"),
        ("@at 2026-02-30T10:00:00Z", "invalid date"),
        ("@at 2026-12-02T24:00:00Z", "invalid date"),
        ("@at 2026-12-31T23:59:60Z", "leap seconds"),
        ("@at 2026-12-02T10:00:00+24:00", "offset is out of range"),
        ("@at 2026-12-02T10:00:00+02:60", "offset is out of range"),
        ("@at 2263-01-01T00:00:00Z", "outside the supported range"),
        ("@at 1600-01-01T00:00:00Z", "outside the supported range"),
        ("hello", "needs 5 fields"),
        ("* * * *", "needs 5 fields"),
        ("0 * * * * *", "needs 5 fields"),
        ("60 * * * *", "minute value 60 is outside 0-59"),
        ("* 24 * * *", "hour value 24 is outside 0-23"),
        ("* * 0 * *", "day-of-month value 0 is outside 1-31"),
        ("* * * 13 *", "month value 13 is outside 1-12"),
        ("* * * * 8", "day-of-week value 8 is outside 0-7"),
        ("* * * foo *", "invalid month value"),
        ("* * * * mon-", "invalid day-of-week value"),
        ("*/0 * * * *", "step 0 is outside"),
        ("*/61 * * * *", "step 61 is outside"),
        ("*/x * * * *", "invalid minute step"),
        ("5-2 * * * *", "runs backwards"),
        ("1,,2 * * * *", "empty list element"),
        ("* * L * *", "invalid day-of-month value"),
        ("* * ? * *", "invalid day-of-month value"),
        ("* * * * 1#2", "invalid day-of-week value"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid_specs(text: str, reason_part: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(text)
    assert reason_part in info.value.reason


def test_both_day_fields_restricted_never_fires_check_uses_or() -> None:
    # Feb 30 never exists, but with a restricted day-of-week it is "Feb 30 OR Monday".
    assert parse_spec("0 0 30 2 1").next_after(utc(2026, 1, 1)) == utc(2026, 2, 2)


@pytest.mark.parametrize(
    ("zone", "reason_part"),
    [
        ("Mars/Olympus_Mons", "unknown timezone"),
        ("America", "unknown timezone"),
        ("../etc/passwd", "unknown timezone"),
        ("/usr/share/zoneinfo/UTC", "unknown timezone"),
        ("localtime", "unknown timezone"),
        ("", "unknown timezone"),
        ("Europe/" + "x" * 100, "limit is 64"),
    ],
)
def test_invalid_timezones(zone: str, reason_part: str) -> None:
    for text in ("0 9 * * *", "@every 5m"):
        with pytest.raises(InvalidSpec) as info:
            parse_spec(text, timezone=zone)
        assert reason_part in info.value.reason
    with pytest.raises(InvalidSpec):
        Cron("0 9 * * *", zone)


def test_non_string_and_direct_construction_are_validated() -> None:
    with pytest.raises(InvalidSpec, match="must be a string"):
        parse_spec(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec):
        Every(0)
    with pytest.raises(InvalidSpec):
        Every(S // 2)
    with pytest.raises(InvalidSpec):
        Every(367 * DAY)
    with pytest.raises(InvalidSpec):
        At(2**63)
    with pytest.raises(InvalidSpec):
        Cron("* * *")


# ---------------------------------------------------------------------------------------- catch-up


def test_catch_up_100_missed_boundaries() -> None:
    spec = Every(MIN)
    plan = plan_catch_up(spec, 0, 100 * MIN + 30 * S, policy="catch_up")
    assert plan.fire == (*(k * MIN for k in range(1, 65)), 100 * MIN)
    assert len(plan.fire) == 65
    assert plan.skipped == 35
    assert plan.next_planned_ns == 101 * MIN


@pytest.mark.parametrize(
    ("missed", "fired", "skipped"),
    [(0, 0, 0), (1, 1, 0), (63, 63, 0), (64, 64, 0), (65, 65, 0), (66, 65, 1), (100, 65, 35)],
)
def test_catch_up_edges(missed: int, fired: int, skipped: int) -> None:
    plan = plan_catch_up(Every(MIN), 0, missed * MIN, policy="catch_up")
    assert len(plan.fire) == fired
    assert plan.skipped == skipped
    assert fired + skipped == missed
    if missed:
        assert plan.fire[-1] == missed * MIN


def test_coalesce_100_missed_boundaries() -> None:
    plan = plan_catch_up(Every(MIN), 0, 100 * MIN + 30 * S, policy="coalesce")
    assert plan == CatchUpPlan(fire=(100 * MIN,), skipped=99, next_planned_ns=101 * MIN)
    assert plan_catch_up(Every(MIN), 0, 59 * S, policy="coalesce") == CatchUpPlan((), 0, MIN)


def test_catch_up_a_billion_missed_boundaries_is_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[int] = []  # the length of every boundary list the plans build
    boundaries = Every.boundaries

    def spy(self: Every, after_ns: int, until_ns: int, limit: int) -> list[int]:
        out = boundaries(self, after_ns, until_ns, limit)
        listed.append(len(out))
        return out

    monkeypatch.setattr(Every, "boundaries", spy)
    plan = plan_catch_up(Every(S), 0, 10**9 * S, policy="catch_up")
    coalesced = plan_catch_up(Every(S), 0, 10**9 * S, policy="coalesce")
    # Cheap: only the 65 boundaries that fire are ever listed; the skipped ones are counted.
    assert listed == [65]
    assert plan.skipped == 10**9 - 65
    assert plan.fire[-1] == 10**9 * S
    assert coalesced.skipped == 10**9 - 1


def test_catch_up_interval_is_half_open() -> None:
    # last_planned itself was already planned; now itself is due.
    plan = plan_catch_up(Every(MIN), MIN, 3 * MIN, policy="catch_up")
    assert plan.fire == (2 * MIN, 3 * MIN)
    assert plan.next_planned_ns == 4 * MIN


def test_catch_up_with_smaller_limit_and_zero() -> None:
    plan = plan_catch_up(Every(MIN), 0, 10 * MIN, policy="catch_up", max_catch_up=3)
    assert plan.fire == (MIN, 2 * MIN, 3 * MIN, 10 * MIN)
    assert plan.skipped == 6
    zero = plan_catch_up(Every(MIN), 0, 10 * MIN, policy="catch_up", max_catch_up=0)
    assert zero == plan_catch_up(Every(MIN), 0, 10 * MIN, policy="coalesce")


def test_catch_up_without_history_or_with_clock_behind() -> None:
    assert plan_catch_up(Every(MIN), None, 90 * S, policy="catch_up") == CatchUpPlan((), 0, 2 * MIN)
    # The clock went backwards: nothing is due and nothing already planned is planned again.
    assert plan_catch_up(Every(MIN), 10 * MIN, 5 * MIN, policy="catch_up") == CatchUpPlan((), 0, 11 * MIN)


def test_catch_up_with_at() -> None:
    at = At(utc(2026, 12, 2, 10))
    due = plan_catch_up(at, utc(2026, 12, 1), utc(2026, 12, 3), policy="catch_up")
    assert due == CatchUpPlan((at.at_ns,), 0, None)
    assert plan_catch_up(at, utc(2026, 12, 1), utc(2026, 12, 3), policy="coalesce") == due
    assert plan_catch_up(at, utc(2026, 12, 1), utc(2026, 12, 2), policy="catch_up") == CatchUpPlan(
        (), 0, at.at_ns
    )


def test_catch_up_with_cron_after_downtime() -> None:
    spec = parse_spec("0 * * * *", timezone="Europe/Berlin")
    # Down from before the fall-back transition: 100 wall-clock hours but one repeat fires once.
    last = utc(2026, 10, 24)
    now = last + 101 * HOUR
    due = spec.boundaries(last, now, 10**6)
    assert len(due) == 100
    plan = plan_catch_up(spec, last, now, policy="catch_up")
    assert plan.fire == (*due[:64], due[-1])
    assert plan.skipped == 35
    assert plan.next_planned_ns == spec.next_after(now)
    assert plan_catch_up(spec, last, now, policy="coalesce") == CatchUpPlan(
        (due[-1],), 99, spec.next_after(now)
    )


def test_catch_up_with_cron_over_years_is_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec("*/5 * * * *", timezone="America/New_York")
    work = count_cron_work(monkeypatch)
    plan = plan_catch_up(spec, utc(2016, 1, 1), utc(2026, 1, 1), policy="catch_up")
    assert len(plan.fire) == 65
    assert plan.fire[-1] == utc(2026, 1, 1)
    due = (utc(2026, 1, 1) - utc(2016, 1, 1)) // (5 * MIN) - 10 * 12  # 10 repeated hours fire once
    assert plan.skipped == due - 65
    # Cheap: croniter walks the 65 that fire (and a few to find the ends), not the million
    # skipped; those are counted by day, one by one only on the 20 transition days.
    days = (utc(2026, 1, 1) - utc(2016, 1, 1)) // DAY
    assert work["walked"] <= 65 + 10
    assert work["resolved"] <= days
    assert work["one_by_one"] <= 10 * 2 * 24 * 12


def test_catch_up_rejects_bad_options() -> None:
    with pytest.raises(BoundExceeded):
        plan_catch_up(Every(MIN), 0, MIN, policy="catch_up", max_catch_up=limits.MAX_CATCH_UP + 1)
    with pytest.raises(BoundExceeded):
        plan_catch_up(Every(MIN), 0, MIN, policy="catch_up", max_catch_up=-1)
    with pytest.raises(ConfigError):
        plan_catch_up(Every(MIN), 0, MIN, policy="backfill")  # type: ignore[arg-type]


def test_fake_clock_downtime_then_catch_up() -> None:
    spec = parse_spec("@every 10m")
    clock = FakeClock(utc(2026, 1, 1))
    fired = clock.run(spec, 2)
    clock.advance(1000 * 10 * MIN)  # the worker was down
    plan = plan_catch_up(spec, fired[-1], clock.now_ns, policy="catch_up")
    assert len(plan.fire) == 65 and plan.skipped == 1000 - 65
    assert plan.fire[-1] == clock.now_ns
    assert plan.next_planned_ns == clock.now_ns + 10 * MIN
