"""Schedule spec grammar and boundary arithmetic (pure: no I/O, no clock reads, no asyncio).

A spec is one of three forms (surrounding whitespace is ignored, tokens are separated by whitespace,
the whole text is ASCII and at most ``limits.MAX_SPEC_LENGTH`` characters):

``@every <n><unit>``
    A fixed interval. ``n`` is a positive decimal integer (no sign, no leading zeros) and ``unit`` is
    one of ``s``, ``m``, ``h``, ``d`` (24 h) or ``w`` (7 d). The interval must lie between 1 s and
    366 days. Calendar months and years (``1mo``, ``1M``, ``1y``) are rejected because they have no
    fixed length. Boundaries are **anchored at the Unix epoch**: they are the integer multiples of the
    interval (in nanoseconds since 1970-01-01T00:00:00Z), independent of when the schedule was created,
    so every worker computes the same grid without coordination.

``@at <RFC 3339 timestamp>``
    A single boundary, e.g. ``@at 2026-12-02T10:00:00Z`` or ``@at 2026-12-02T12:00:00.123456789+02:00``.
    The UTC offset (``Z`` or ``±HH:MM``) is mandatory; fractional seconds up to nanoseconds are kept
    exactly. The instant is normalized to integer nanoseconds since the epoch (UTC).

five-field cron ``minute hour day-of-month month day-of-week``
    Evaluated on the wall clock of an IANA timezone (``timezone=`` of :func:`parse_spec`, default
    ``UTC``). Each field is a comma list of ``*``, ``v``, ``a-b``, each optionally ``/step``
    (``v/step`` means ``v-max/step``). Months accept ``jan``..``dec``, days of week ``sun``..``sat``;
    day-of-week ``0`` and ``7`` are both Sunday. As in Vixie cron, when both day fields are restricted
    (neither starts with ``*``) a day matches if *either* matches, otherwise both must match.
    Daylight-saving transitions:

    * **gap** (spring forward; the wall time does not exist): the boundary fires **once, at the first
      valid instant after the gap**, i.e. at the transition itself (``30 2 * * *`` in Europe/Berlin on
      2026-03-29 fires at 03:00 CEST = 01:00Z). Several wall times inside one gap collapse into that one
      boundary, and it coincides with a boundary at the wall time the gap jumps to.
    * **repeat** (fall back; the wall time occurs twice): the boundary fires **exactly once, at the
      first occurrence** (``fold=0``). During the repeated hour nothing fires a second time, so e.g.
      ``0 * * * *`` has a two-hour gap between fires across a fall-back transition.

All boundaries are integer nanoseconds since the epoch and lie in the signed 64-bit range
(1677-09-21..2262-04-11); beyond it ``next_after`` returns ``None``.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Literal, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from streamsched.errors import BoundExceeded, ConfigError, InvalidSpec
from streamsched.model import limits

__all__ = [
    "MAX_BOUNDARY_NS",
    "MIN_BOUNDARY_NS",
    "NS_PER_S",
    "At",
    "CatchUpPlan",
    "Cron",
    "Every",
    "Spec",
    "parse_spec",
    "plan_catch_up",
]

NS_PER_S = 1_000_000_000
MIN_BOUNDARY_NS = -(2**63)
"""Earliest representable boundary (Kafka timestamps and Avro longs are signed 64-bit)."""
MAX_BOUNDARY_NS = 2**63 - 1
"""Latest representable boundary."""

_UNIT_NS: dict[str, int] = {
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "d": 86400 * NS_PER_S,
    "w": 7 * 86400 * NS_PER_S,
}
_CALENDAR_UNITS = frozenset(
    {"M", "mo", "mon", "mons", "month", "months", "y", "Y", "yr", "yrs", "year", "years"}
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_ONE_DAY = timedelta(days=1)
_ONE_HOUR = timedelta(hours=1)


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise BoundExceeded("boundaries limit", 0, limit)


@dataclass(frozen=True, slots=True)
class Every:
    """``@every``: boundaries at every integer multiple of ``interval_ns`` since the Unix epoch."""

    interval_ns: int

    def __post_init__(self) -> None:
        if type(self.interval_ns) is not int:
            raise InvalidSpec("interval must be an integer number of nanoseconds")
        if self.interval_ns <= 0:
            raise InvalidSpec("interval must be positive")
        low = limits.MIN_EVERY_INTERVAL_S * NS_PER_S
        high = limits.MAX_EVERY_INTERVAL_S * NS_PER_S
        if not low <= self.interval_ns <= high:
            raise InvalidSpec("interval must be between 1s and 366d")

    def next_after(self, t_ns: int) -> int | None:
        """The first boundary strictly after ``t_ns``: ``(t_ns // interval + 1) * interval``."""
        nxt = (t_ns // self.interval_ns + 1) * self.interval_ns
        return nxt if MIN_BOUNDARY_NS <= nxt <= MAX_BOUNDARY_NS else None

    def latest_at_or_before(self, t_ns: int) -> int | None:
        """The last boundary ``<= t_ns``."""
        prev = (t_ns // self.interval_ns) * self.interval_ns
        return prev if MIN_BOUNDARY_NS <= prev <= MAX_BOUNDARY_NS else None

    def count_between(self, after_ns: int, until_ns: int) -> int:
        """Number of boundaries in ``(after_ns, until_ns]``, in O(1)."""
        after = max(after_ns, MIN_BOUNDARY_NS - 1)
        until = min(until_ns, MAX_BOUNDARY_NS)
        if until <= after:
            return 0
        return until // self.interval_ns - after // self.interval_ns

    def boundaries(self, after_ns: int, until_ns: int, limit: int) -> list[int]:
        """Boundaries in ``(after_ns, until_ns]`` in order, at most ``limit`` of them."""
        _check_limit(limit)
        count = min(limit, self.count_between(after_ns, until_ns))
        if count == 0:
            return []
        first_k = max(after_ns, MIN_BOUNDARY_NS - 1) // self.interval_ns + 1
        return [(first_k + i) * self.interval_ns for i in range(count)]


@dataclass(frozen=True, slots=True)
class At:
    """``@at``: a single boundary at ``at_ns`` (UTC nanoseconds since the epoch)."""

    at_ns: int

    def __post_init__(self) -> None:
        if type(self.at_ns) is not int:
            raise InvalidSpec("instant must be an integer number of nanoseconds")
        if not MIN_BOUNDARY_NS <= self.at_ns <= MAX_BOUNDARY_NS:
            raise InvalidSpec("timestamp is outside the supported range 1677-09-21..2262-04-11")

    def next_after(self, t_ns: int) -> int | None:
        """``at_ns`` if it is strictly after ``t_ns``, else ``None``."""
        return self.at_ns if self.at_ns > t_ns else None

    def latest_at_or_before(self, t_ns: int) -> int | None:
        """``at_ns`` if it is ``<= t_ns``, else ``None``."""
        return self.at_ns if self.at_ns <= t_ns else None

    def count_between(self, after_ns: int, until_ns: int) -> int:
        """1 if ``at_ns`` lies in ``(after_ns, until_ns]``, else 0."""
        return 1 if after_ns < self.at_ns <= until_ns else 0

    def boundaries(self, after_ns: int, until_ns: int, limit: int) -> list[int]:
        """``[at_ns]`` if it lies in ``(after_ns, until_ns]`` and ``limit >= 1``, else ``[]``."""
        _check_limit(limit)
        return [self.at_ns] if limit >= 1 and self.count_between(after_ns, until_ns) else []


# ---------------------------------------------------------------------------------------------------
# cron

_MONTH_NAMES = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DOW_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
# (name, low, high, names) per field, in expression order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int] | None], ...] = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, _MONTH_NAMES),
    ("day-of-week", 0, 7, _DOW_NAMES),
)
# Leap years included: a day-of-month only "never fires" if no month in any year can hold it.
_MAX_MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
_NUMBER = re.compile(r"[0-9]{1,2}", re.ASCII)
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*", re.ASCII)


def _short(token: str) -> str:
    return repr(token if len(token) <= 24 else token[:24] + "...")


def _field_value(token: str, name: str, low: int, high: int, names: dict[str, int] | None) -> int:
    if names is not None and token.lower() in names:
        return names[token.lower()]
    if not _NUMBER.fullmatch(token):
        raise InvalidSpec(f"invalid {name} value {_short(token)}")
    value = int(token)
    if not low <= value <= high:
        raise InvalidSpec(f"{name} value {value} is outside {low}-{high}")
    return value


def _parse_field(text: str, name: str, low: int, high: int, names: dict[str, int] | None) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise InvalidSpec(f"empty list element in the {name} field")
        base, has_step, step_text = part.partition("/")
        step = 1
        if has_step:
            if not _NUMBER.fullmatch(step_text):
                raise InvalidSpec(f"invalid {name} step {_short(step_text)}")
            step = int(step_text)
            if not 1 <= step <= high - low + 1:
                raise InvalidSpec(f"{name} step {step} is outside 1-{high - low + 1}")
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _field_value(first, name, low, high, names)
            end = _field_value(last, name, low, high, names)
            if start > end:
                raise InvalidSpec(f"{name} range {_short(base)} runs backwards")
        else:
            start = _field_value(base, name, low, high, names)
            # Vixie cron: "v/step" means "v-high/step".
            end = high if has_step else start
        values.update(range(start, end + 1, step))
    return values


@dataclass(frozen=True, slots=True)
class _CronFields:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    day_or: bool

    def day_matches(self, day: date) -> bool:
        dom_ok = day.day in self.doms
        dow_ok = day.isoweekday() % 7 in self.dows
        return (dom_ok or dow_ok) if self.day_or else (dom_ok and dow_ok)

    def days_forward(self, start: date) -> Iterator[date]:
        year, month, day = start.year, start.month, start.day
        while year <= 9999:
            if month in self.months:
                for d in range(day, calendar.monthrange(year, month)[1] + 1):
                    candidate = date(year, month, d)
                    if self.day_matches(candidate):
                        yield candidate
            day = 1
            month += 1
            if month > 12:
                month, year = 1, year + 1

    def days_backward(self, start: date) -> Iterator[date]:
        year, month, day = start.year, start.month, start.day
        while year >= 1:
            if month in self.months:
                for d in range(day, 0, -1):
                    candidate = date(year, month, d)
                    if self.day_matches(candidate):
                        yield candidate
            month -= 1
            if month < 1:
                month, year = 12, year - 1
            if year >= 1:
                day = calendar.monthrange(year, month)[1]

    def walls_forward(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall minutes ``>= start`` (start already floored to the minute)."""
        first_day = start.date()
        for day in self.days_forward(first_day):
            for hour in self.hours:
                if day == first_day and hour < start.hour:
                    continue
                for minute in self.minutes:
                    if day == first_day and hour == start.hour and minute < start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)

    def walls_backward(self, start: datetime) -> Iterator[datetime]:
        """Matching naive wall minutes ``<= start``, latest first."""
        first_day = start.date()
        for day in self.days_backward(first_day):
            for hour in reversed(self.hours):
                if day == first_day and hour > start.hour:
                    continue
                for minute in reversed(self.minutes):
                    if day == first_day and hour == start.hour and minute > start.minute:
                        continue
                    yield datetime(day.year, day.month, day.day, hour, minute)


def _parse_cron(expr: str) -> _CronFields:
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidSpec(
            f"cron expression needs 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    parsed = [_parse_field(text, *spec) for text, spec in zip(fields, _FIELDS, strict=True)]
    minutes, hours, doms, months, dows = parsed
    dows = {0 if d == 7 else d for d in dows}
    dom_star = fields[2].startswith("*")
    dow_star = fields[4].startswith("*")
    day_or = not dom_star and not dow_star
    # With AND semantics a day-of-month that no selected month can hold never fires; reject it
    # rather than searching forever. Every valid date falls on every weekday within 400 years.
    if not day_or and not any(d <= _MAX_MONTH_DAYS[m] for m in months for d in doms):
        raise InvalidSpec("day-of-month and month never coincide, the expression never fires")
    return _CronFields(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        doms=frozenset(doms),
        months=frozenset(months),
        dows=frozenset(dows),
        day_or=day_or,
    )


def _load_zone(key: object) -> ZoneInfo:
    if not isinstance(key, str):
        raise InvalidSpec("timezone must be a string")
    if len(key) > limits.MAX_TIMEZONE_LENGTH:
        raise InvalidSpec(f"timezone is {len(key)} characters, limit is {limits.MAX_TIMEZONE_LENGTH}")
    # The regex keeps file-system paths and "localtime" (host-dependent) out of zoneinfo's lookup.
    if not _ZONE_KEY.fullmatch(key) or key.lower() in {"localtime", "posixrules"}:
        raise InvalidSpec(f"unknown timezone {_short(key)}")
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSpec(f"unknown timezone {_short(key)}") from None


class _Window:
    """Counts distinct boundaries in ``[first, last]`` fed in non-decreasing order.

    Resolution is monotone in wall time but not injective (a gap collapses onto its transition,
    possibly across a day boundary), so equal consecutive instants are counted once.
    """

    __slots__ = ("count", "first", "last", "previous")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.count = 0
        self.previous: int | None = None

    def add(self, instant: int) -> None:
        if self.first <= instant <= self.last and instant != self.previous:
            self.count += 1
            self.previous = instant

    def add_grid(self, base_s: int, hours: tuple[int, ...], minutes: tuple[int, ...]) -> None:
        """Add ``base_s + 3600 h + 60 m`` (seconds) for all ``h``, ``m``: a stretch without transitions."""
        low = (base_s + 3600 * hours[0] + 60 * minutes[0]) * NS_PER_S
        high = (base_s + 3600 * hours[-1] + 60 * minutes[-1]) * NS_PER_S
        if high < self.first or low > self.last:
            return
        if self.first <= low and high <= self.last:
            self.count += len(hours) * len(minutes) - (1 if low == self.previous else 0)
            self.previous = high
            return
        for hour in hours:
            for minute in minutes:
                self.add((base_s + 3600 * hour + 60 * minute) * NS_PER_S)


def _epoch_s(aware: datetime) -> int:
    return (aware - _EPOCH) // _ONE_SECOND


@dataclass(frozen=True)
class Cron:
    """Five-field cron ``expr`` on the wall clock of IANA ``timezone``; see the module docstring
    for the field syntax and the daylight-saving rules (gap: fire once at the transition; repeat:
    fire once at the first occurrence)."""

    expr: str
    timezone: str = "UTC"
    _fields: _CronFields = field(init=False, repr=False, compare=False)
    _tz: ZoneInfo = field(init=False, repr=False, compare=False)
    _gap_memo: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str):
            raise InvalidSpec("cron expression must be a string")
        if not self.expr.isascii():
            raise InvalidSpec("spec must be ASCII")
        # Normalize whitespace and case so equal schedules compare (and hash) equal.
        object.__setattr__(self, "expr", " ".join(self.expr.split()).lower())
        object.__setattr__(self, "_fields", _parse_cron(self.expr))
        object.__setattr__(self, "_tz", _load_zone(self.timezone))
        object.__setattr__(self, "_gap_memo", [MIN_BOUNDARY_NS // NS_PER_S - 1])

    # -- wall clock <-> instants -------------------------------------------------------------------

    def _wall(self, t_s: int) -> datetime:
        return (_EPOCH + timedelta(seconds=t_s)).astimezone(self._tz)

    def _offset(self, t_s: int) -> timedelta | None:
        return self._wall(t_s).utcoffset()

    def _resolve(self, wall: datetime) -> int:
        """Epoch seconds at which the naive wall time ``wall`` fires (gap: transition; repeat: fold=0)."""
        first = _epoch_s(wall.replace(tzinfo=self._tz, fold=0))
        second = _epoch_s(wall.replace(tzinfo=self._tz, fold=1))
        if first <= second:
            # Unambiguous (equal) or repeated: fold=0 is the first occurrence.
            return first
        # PEP 495 gap: fold=0 uses the offset before the transition, so the transition instant lies
        # in (second, first]; find it exactly by bisection on whole seconds. Walking a gap minute by
        # minute asks for the same transition repeatedly, and a window as narrow as the gap holds
        # only one transition, so a remembered transition inside it is the answer.
        remembered = self._gap_memo[0]
        if second < remembered <= first:
            return remembered
        low, high = second, first
        after = self._offset(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self._offset(mid) == after:
                high = mid
            else:
                low = mid
        self._gap_memo[0] = high
        return high

    def _iter_after(self, t_ns: int) -> Iterator[int]:
        """Distinct boundaries strictly after ``t_ns`` in increasing order (within int64)."""
        if t_ns >= MAX_BOUNDARY_NS:
            return
        t_ns = max(t_ns, MIN_BOUNDARY_NS)
        # Starting from the wall minute of t is enough: resolution is monotone in wall time, and a
        # t in the second half of a repeat just skips the fold=0 instants that are already past.
        start = self._wall(t_ns // NS_PER_S).replace(tzinfo=None, second=0, microsecond=0)
        last = t_ns
        for wall in self._fields.walls_forward(start):
            instant = self._resolve(wall) * NS_PER_S
            if instant > MAX_BOUNDARY_NS:
                return
            if instant > last:
                last = instant
                yield instant

    def next_after(self, t_ns: int) -> int | None:
        """The first boundary strictly after ``t_ns``, or ``None`` beyond the int64 range."""
        return next(self._iter_after(t_ns), None)

    def latest_at_or_before(self, t_ns: int) -> int | None:
        """The last boundary ``<= t_ns``, or ``None`` if there is none in the int64 range."""
        if t_ns < MIN_BOUNDARY_NS:
            return None
        t_ns = min(t_ns, MAX_BOUNDARY_NS)
        aware = self._wall(t_ns // NS_PER_S)
        wall = aware.replace(tzinfo=None)
        # In the second half of a repeat, later wall times still resolve (fold=0) to earlier instants;
        # start the backward walk far enough ahead to see them.
        first_offset = wall.replace(tzinfo=self._tz, fold=0).utcoffset()
        own_offset = aware.utcoffset()
        assert first_offset is not None and own_offset is not None
        slack = max(first_offset - own_offset, timedelta(0))
        start = (wall + slack).replace(second=0, microsecond=0)
        for candidate in self._fields.walls_backward(start):
            instant = self._resolve(candidate) * NS_PER_S
            if instant < MIN_BOUNDARY_NS:
                return None
            if instant <= t_ns:
                return instant
        return None

    def count_between(self, after_ns: int, until_ns: int) -> int:
        """Number of boundaries in ``(after_ns, until_ns]``.

        Cost is proportional to the number of matching *days* in the window, not to the number of
        boundaries: a day (or, on a transition day, an hour) whose wall clock runs without a
        transition is counted arithmetically; only the hours containing a transition resolve each
        wall time. Exact unless one calendar day holds two transitions that cancel out.
        """
        first = self.next_after(after_ns)
        if first is None or first > until_ns:
            return 0
        last = self.latest_at_or_before(until_ns)
        assert last is not None and last >= first
        fields = self._fields
        # One day of margin either side: gap wall times can resolve onto a neighbouring date.
        start_day = self._wall(first // NS_PER_S).date() - _ONE_DAY
        end_day = self._wall(last // NS_PER_S).date() + _ONE_DAY
        window = _Window(first, last)
        # The next midnight's resolution is reused when consecutive days match (most schedules).
        cached_day: date | None = None
        cached_start = 0
        for day in fields.days_forward(start_day):
            if day > end_day:
                break
            midnight = datetime(day.year, day.month, day.day)
            day_start = cached_start if day == cached_day else self._resolve(midnight)
            if day_start * NS_PER_S > last:
                break
            next_midnight = midnight + _ONE_DAY
            # 24 real hours after midnight it is midnight again iff no transition happened that day
            # (one astimezone instead of resolving both fold variants).
            probe = self._wall(day_start + 86400)
            regular = probe.fold == 0 and probe.replace(tzinfo=None) == next_midnight
            cached_day = day + _ONE_DAY
            cached_start = day_start + 86400 if regular else self._resolve(next_midnight)
            if regular:
                window.add_grid(day_start, fields.hours, fields.minutes)
                continue
            for hour in fields.hours:
                hour_wall = midnight.replace(hour=hour)
                hour_start = self._resolve(hour_wall)
                if self._resolve(hour_wall + _ONE_HOUR) - hour_start == 3600:
                    window.add_grid(hour_start, (0,), fields.minutes)
                    continue
                for minute in fields.minutes:
                    window.add(self._resolve(hour_wall.replace(minute=minute)) * NS_PER_S)
        return window.count

    def boundaries(self, after_ns: int, until_ns: int, limit: int) -> list[int]:
        """Boundaries in ``(after_ns, until_ns]`` in order, at most ``limit`` of them."""
        _check_limit(limit)
        out: list[int] = []
        if limit == 0:
            return out
        for instant in self._iter_after(after_ns):
            if instant > until_ns:
                break
            out.append(instant)
            if len(out) >= limit:
                break
        return out


Spec: TypeAlias = Every | At | Cron
"""A parsed schedule spec; all variants share ``next_after``, ``latest_at_or_before``,
``count_between`` and ``boundaries``."""


# ---------------------------------------------------------------------------------------------------
# parsing

_INTERVAL = re.compile(r"([0-9]+)([A-Za-z]+)", re.ASCII)
_COMPOUND_INTERVAL = re.compile(r"(?:[0-9]+[A-Za-z]+){2,}", re.ASCII)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))?",
    re.ASCII,
)


def _parse_interval(token: str) -> int:
    match = _INTERVAL.fullmatch(token)
    if match is None:
        if token[:1] in ("+", "-"):
            raise InvalidSpec("interval must be a positive integer without a sign, e.g. 5m")
        if "." in token or "," in token:
            raise InvalidSpec("interval count must be a whole number, e.g. 90s instead of 1.5m")
        if token.isdigit():
            raise InvalidSpec("interval has no unit (use s, m, h, d or w)")
        if _COMPOUND_INTERVAL.fullmatch(token):
            raise InvalidSpec("compound intervals are not supported, use one unit (e.g. 90m for 1h30m)")
        raise InvalidSpec(f"interval {_short(token)} must look like <n><unit>, e.g. 30s, 5m, 1h")
    digits, unit = match.groups()
    if unit in _CALENDAR_UNITS:
        raise InvalidSpec("calendar months and years are not intervals")
    if unit not in _UNIT_NS:
        raise InvalidSpec(f"unknown interval unit {_short(unit)} (use s, m, h, d or w)")
    if int(digits) == 0:
        raise InvalidSpec("interval must be positive")
    if digits.startswith("0"):
        raise InvalidSpec("interval count must not have leading zeros")
    interval_ns = int(digits) * _UNIT_NS[unit]
    if interval_ns > limits.MAX_EVERY_INTERVAL_S * NS_PER_S:
        raise InvalidSpec("interval must be between 1s and 366d")
    return interval_ns


def _parse_rfc3339(token: str) -> int:
    match = _RFC3339.fullmatch(token)
    if match is None:
        raise InvalidSpec(f"timestamp {_short(token)} is not RFC 3339, expected e.g. 2026-12-02T10:00:00Z")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    if zulu is None and sign is None:
        raise InvalidSpec("timestamp has no UTC offset (append Z or ±HH:MM)")
    if fraction is not None and len(fraction) > 9:
        raise InvalidSpec("fractional seconds finer than nanoseconds are not supported")
    if second == "60":
        raise InvalidSpec("leap seconds are not supported")
    offset_s = 0
    if sign is not None:
        if int(off_h) > 23 or int(off_m) > 59:
            raise InvalidSpec("UTC offset is out of range")
        offset_s = (int(off_h) * 3600 + int(off_m) * 60) * (1 if sign == "+" else -1)
    try:
        civil = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=UTC)
    except ValueError:
        raise InvalidSpec("timestamp has an invalid date or time of day") from None
    # Fraction digits are scaled as an integer: a float would lose nanoseconds beyond ~2^53.
    frac_ns = int(fraction.ljust(9, "0")) if fraction else 0
    at_ns = (_epoch_s(civil) - offset_s) * NS_PER_S + frac_ns
    if not MIN_BOUNDARY_NS <= at_ns <= MAX_BOUNDARY_NS:
        raise InvalidSpec("timestamp is outside the supported range 1677-09-21..2262-04-11")
    return at_ns


def parse_spec(text: str, *, timezone: str | None = None) -> Spec:
    """Parse a schedule spec (see the module docstring for the grammar).

    ``timezone`` is the IANA zone a cron expression is evaluated in (``None`` means ``UTC``); it is
    validated for every form but only cron uses it, since ``@every`` and ``@at`` are absolute.
    Raises :class:`~streamsched.errors.InvalidSpec` with a ``reason`` for anything invalid.
    """
    if not isinstance(text, str):
        raise InvalidSpec("spec must be a string")
    if len(text) > limits.MAX_SPEC_LENGTH:
        raise InvalidSpec(f"spec is {len(text)} characters, limit is {limits.MAX_SPEC_LENGTH}")
    if timezone is not None:
        _load_zone(timezone)
    if not text.isascii():
        raise InvalidSpec("spec must be ASCII")
    tokens = text.split()
    if not tokens:
        raise InvalidSpec("spec is empty")
    head = tokens[0]
    if head == "@every":
        if len(tokens) != 2:
            raise InvalidSpec("@every takes exactly one interval, e.g. '@every 5m'")
        return Every(_parse_interval(tokens[1]))
    if head == "@at":
        if len(tokens) != 2:
            raise InvalidSpec("@at takes exactly one RFC 3339 timestamp, e.g. '@at 2026-12-02T10:00:00Z'")
        return At(_parse_rfc3339(tokens[1]))
    if head.startswith("@"):
        raise InvalidSpec(
            f"unknown directive {_short(head)}; expected @every, @at or a five-field cron expression"
        )
    return Cron(" ".join(tokens), timezone if timezone is not None else "UTC")


# ---------------------------------------------------------------------------------------------------
# catch-up


@dataclass(frozen=True, slots=True)
class CatchUpPlan:
    """What to do after downtime: fire ``fire`` now (in order), count ``skipped`` boundaries as
    missed, and plan the next timer at ``next_planned_ns`` (``None``: the spec never fires again)."""

    fire: tuple[int, ...]
    skipped: int
    next_planned_ns: int | None


def plan_catch_up(
    spec: Spec,
    last_planned_ns: int | None,
    now_ns: int,
    *,
    policy: Literal["catch_up", "coalesce"],
    max_catch_up: int = limits.MAX_CATCH_UP,
) -> CatchUpPlan:
    """Plan the boundaries missed while no worker was running.

    The *due* boundaries are those in ``(last_planned_ns, now_ns]``; say there are ``D`` of them.

    * ``policy="catch_up"``: if ``D <= max_catch_up`` all of them fire, ``skipped == 0``. Otherwise
      the first ``max_catch_up`` due boundaries fire in order and then the schedule skips forward to
      the **latest** due boundary, which **also fires** (it is the current occurrence, not a
      catch-up); the ones in between are skipped: ``len(fire) == max_catch_up + 1`` and
      ``skipped == D - max_catch_up - 1``. With 100 missed boundaries and the default 64: 65 fire
      (64 caught up plus the latest), 35 are skipped.
    * ``policy="coalesce"``: only the latest due boundary fires, ``skipped == D - 1``.

    ``last_planned_ns=None`` means the schedule has no history: nothing is due (no backfill); callers
    that want boundaries since creation pass the creation time. ``next_planned_ns`` is the first
    boundary after both ``now_ns`` and ``last_planned_ns`` (a boundary already planned is never
    planned again, even if the clock went backwards).

    ``D`` is computed arithmetically for ``@every`` (10^9 missed boundaries cost O(1)); for cron the
    first ``max_catch_up + 1`` are iterated, the latest is found by walking backwards from
    ``now_ns``, and ``D`` is counted per day.
    """
    if policy not in ("catch_up", "coalesce"):
        raise ConfigError(f"unknown catch-up policy {policy!r}, expected 'catch_up' or 'coalesce'")
    limits.check_range("max_catch_up", max_catch_up, 0, limits.MAX_CATCH_UP)
    horizon = now_ns if last_planned_ns is None else max(now_ns, last_planned_ns)
    next_planned = spec.next_after(horizon)
    if last_planned_ns is None or last_planned_ns >= now_ns:
        return CatchUpPlan((), 0, next_planned)
    if policy == "coalesce":
        latest = spec.latest_at_or_before(now_ns)
        if latest is None or latest <= last_planned_ns:
            return CatchUpPlan((), 0, next_planned)
        due = spec.count_between(last_planned_ns, now_ns)
        return CatchUpPlan((latest,), due - 1, next_planned)
    head = spec.boundaries(last_planned_ns, now_ns, max_catch_up + 1)
    if len(head) <= max_catch_up:
        return CatchUpPlan(tuple(head), 0, next_planned)
    due = spec.count_between(last_planned_ns, now_ns)
    latest = spec.latest_at_or_before(now_ns)
    assert latest is not None
    return CatchUpPlan((*head[:max_catch_up], latest), due - max_catch_up - 1, next_planned)
