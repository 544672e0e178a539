"""Five-field cron expressions on the wall clock of an IANA timezone (pure: no I/O, no clock reads).

Grammar and daylight-saving rules are documented in :mod:`streamsched.model.specs`. This module
splits the work between croniter and three small pieces of our own:

* **croniter** (5.x and 7.x: the faust extra pins <6, so ``make test`` runs on 5.x) finds the
  next and previous *wall times* (naive datetimes) that match the fields. It is handed a
  canonical expression built from our parsed value sets (comma lists or
  ``*``) and an explicit day-of-month/day-of-week rule, so its own grammar extensions and quirks
  never apply (its ``v/step`` in the day-of-week field spans 0-6, Vixie's and ours 0-7:
  ``1/3`` is {1, 4} there and {Mon, Thu, Sun} here).
* **Validation is ours.** croniter accepts a superset we refuse (``L``, ``W``, ``#``, ``?``,
  ``H``, a seconds and a year field, ``@hourly``) and its errors do not say which field is wrong
  or why; :class:`~streamsched.errors.InvalidSpec` carries that reason. The parse also yields the
  hour and minute sets the counting below needs.
* **Wall time -> instant is ours** (``Cron._resolve``: a repeated wall time fires at its first
  occurrence, a wall time in a gap at the transition). croniter on a timezone-aware start has
  other rules, measured with croniter 7.0.0: it fires a repeated wall time twice (``30 2 * * *``
  in Europe/Berlin fires 2026-10-25 at 00:30Z *and* 01:30Z), and when the hour field is ``*`` it
  drops a gap's wall times instead of firing at the transition (``30 * * * *`` in Europe/Berlin
  goes from 00:30Z to 01:30Z on 2026-03-29, nothing at 01:00Z; same for ``*/7 * * * *`` across
  Australia/Lord_Howe's 30-minute gap). Our rules are the documented ones (docs/schedules.md), so
  croniter only ever sees naive wall times.
* **Counting is ours** (``Cron.count_between``): catch-up reports how many boundaries it skipped,
  possibly after years of downtime, and enumerating them one by one through any iterator is too
  slow (26 years of ``* * * * *`` are 13.7 M boundaries). A day without a transition contributes
  ``len(hours) * len(minutes)``; only hours holding a transition resolve each wall time. The tests
  check this count against croniter's enumeration across transitions in several zones.

Measured (croniter 7.0.0, Python 3.11, this project's shared 2-core machine, Europe/Berlin,
best of 5, for ``* * * * *``, ``*/5 * * * *``, ``0 9 * * 1-5``, ``0 0 1 jan,jul *`` and
``0 0 13 * 5``, the replaced engine imported side by side): ``next_after`` 55-135 us per call
(hand-written engine before: 12-22 us); the ticker's per-schedule planning, ``plan_catch_up``
with one due boundary, 150-290 us (before: 28-56 us); ``plan_catch_up`` after 27 years of
downtime 3-90 ms (before: 1-80 ms; counting dominates and is unchanged). So a tick that fires
``MAX_FIRES_PER_TXN`` (512) cron occurrences spends at most ~0.15 s planning, inside the 0.5 s
the ticker plans ahead: 4-7 times slower, not slow for our use. Each call copies a prebuilt
croniter (3 us) instead of building one (60-120 us of parsing).

Why one module just above ~400 lines: parsing yields the value sets that resolution and counting
use; about a third of it is this docstring, which records the measured reasons above.
"""

from __future__ import annotations

import calendar
import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from streamsched.errors import InvalidSpec
from streamsched.model import limits
from streamsched.model.instants import MAX_BOUNDARY_NS, MIN_BOUNDARY_NS, NS_PER_S, check_limit, quote_token

__all__ = ["Cron", "load_zone"]

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
_FULL = (frozenset(range(60)), frozenset(range(24)), frozenset(range(1, 32)), frozenset(range(1, 13)),
         frozenset(range(7)))
# Leap years included: a day-of-month only "never fires" if no month in any year can hold it.
_MAX_MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
# Every valid date falls on every weekday within one 400-year Gregorian cycle, so a search this long
# finds any expression that passed validation.
_MAX_YEARS_BETWEEN_MATCHES = 400
_NUMBER = re.compile(r"[0-9]{1,2}", re.ASCII)
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*", re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND = timedelta(seconds=1)
_ONE_MINUTE = timedelta(minutes=1)
_ONE_HOUR = timedelta(hours=1)
_ONE_DAY = timedelta(days=1)


def _field_value(token: str, name: str, low: int, high: int, names: dict[str, int] | None) -> int:
    if names is not None and token.lower() in names:
        return names[token.lower()]
    if not _NUMBER.fullmatch(token):
        raise InvalidSpec(f"invalid {name} value {quote_token(token)}")
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
                raise InvalidSpec(f"invalid {name} step {quote_token(step_text)}")
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
                raise InvalidSpec(f"{name} range {quote_token(base)} runs backwards")
        else:
            start = _field_value(base, name, low, high, names)
            # Vixie cron: "v/step" means "v-high/step".
            end = high if has_step else start
        values.update(range(start, end + 1, step))
    return values


def _listed(values: frozenset[int], full: frozenset[int]) -> str:
    return "*" if values == full else ",".join(str(v) for v in sorted(values))


@dataclass(frozen=True, slots=True)
class _CronFields:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    day_or: bool
    croniter_expr: str
    """The same schedule as a canonical expression croniter reads exactly like we do."""
    croniter_day_or: bool

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.doms
        dow_ok = day.isoweekday() % 7 in self.dows
        return (dom_ok or dow_ok) if self.day_or else (dom_ok and dow_ok)


def _parse_cron(expr: str) -> _CronFields:
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidSpec(
            f"cron expression needs 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    parsed = [frozenset(_parse_field(text, *spec)) for text, spec in zip(fields, _FIELDS, strict=True)]
    minutes, hours, doms, months, dows = parsed
    dows = frozenset(0 if d == 7 else d for d in dows)
    # Vixie cron: the day fields are OR-ed when both are restricted (neither starts with '*').
    day_or = not fields[2].startswith("*") and not fields[4].startswith("*")
    dom_possible = any(d <= _MAX_MONTH_DAYS[m] for m in months for d in doms)
    # With AND semantics a day-of-month that no selected month can hold never fires; reject it
    # rather than searching forever. Every valid date falls on every weekday within 400 years.
    if not day_or and not dom_possible:
        raise InvalidSpec("day-of-month and month never coincide, the expression never fires")
    minute_text, hour_text, month_text = (_listed(minutes, _FULL[0]), _listed(hours, _FULL[1]),
                                          _listed(months, _FULL[3]))
    if not day_or:
        dom_text, dow_text, cron_or = _listed(doms, _FULL[2]), _listed(dows, _FULL[4]), False
    elif not dom_possible:
        # OR with a day-of-month side that never exists (Feb 30): the weekday side alone decides.
        # Said explicitly, croniter does not search 400 years for the impossible side on every call.
        dom_text, dow_text, cron_or = "*", _listed(dows, _FULL[4]), False
    elif doms == _FULL[2] or dows == _FULL[4]:
        dom_text, dow_text, cron_or = "*", "*", False  # one side matches every day
    else:
        dom_text, dow_text, cron_or = _listed(doms, _FULL[2]), _listed(dows, _FULL[4]), True
    return _CronFields(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        doms=doms,
        months=months,
        dows=dows,
        day_or=day_or,
        croniter_expr=f"{minute_text} {hour_text} {dom_text} {month_text} {dow_text}",
        croniter_day_or=cron_or,
    )


def load_zone(key: object) -> ZoneInfo:
    """The IANA zone ``key``, or :class:`~streamsched.errors.InvalidSpec` with the reason."""
    if not isinstance(key, str):
        raise InvalidSpec("timezone must be a string")
    if len(key) > limits.MAX_TIMEZONE_LENGTH:
        raise InvalidSpec(f"timezone is {len(key)} characters, limit is {limits.MAX_TIMEZONE_LENGTH}")
    # The regex keeps file-system paths and "localtime" (host-dependent) out of zoneinfo's lookup.
    if not _ZONE_KEY.fullmatch(key) or key.lower() in {"localtime", "posixrules"}:
        raise InvalidSpec(f"unknown timezone {quote_token(key)}")
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSpec(f"unknown timezone {quote_token(key)}") from None


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
    """Five-field cron ``expr`` on the wall clock of IANA ``timezone``; see
    :mod:`streamsched.model.specs` for the field syntax and the daylight-saving rules (gap: fire
    once at the transition; repeat: fire once at the first occurrence)."""

    expr: str
    timezone: str = "UTC"
    _fields: _CronFields = field(init=False, repr=False, compare=False)
    _tz: ZoneInfo = field(init=False, repr=False, compare=False)
    _gap_memo: list[int] = field(init=False, repr=False, compare=False)
    _template: croniter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expr, str):
            raise InvalidSpec("cron expression must be a string")
        if not self.expr.isascii():
            raise InvalidSpec("spec must be ASCII")
        # Normalize whitespace and case so equal schedules compare (and hash) equal.
        object.__setattr__(self, "expr", " ".join(self.expr.split()).lower())
        object.__setattr__(self, "_fields", _parse_cron(self.expr))
        object.__setattr__(self, "_tz", load_zone(self.timezone))
        object.__setattr__(self, "_gap_memo", [MIN_BOUNDARY_NS // NS_PER_S - 1])
        # Building a croniter parses the expression (60-120 us); a shallow copy of this never-iterated
        # template is 3 us and independent: iteration only rebinds the copy's own attributes.
        object.__setattr__(self, "_template", croniter(
            self._fields.croniter_expr, _EPOCH.replace(tzinfo=None), day_or=self._fields.croniter_day_or,
            max_years_between_matches=_MAX_YEARS_BETWEEN_MATCHES))

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

    def _walls(self, start: datetime, *, backward: bool) -> Iterator[datetime]:
        """Matching naive wall minutes from croniter: ``>= start`` ascending, or ``<= start``
        descending with ``backward`` (``start`` is a whole minute)."""
        it = copy.copy(self._template)
        # croniter answers strictly after (before) its current time, so start one minute outside.
        it.set_current(start + (_ONE_MINUTE if backward else -_ONE_MINUTE))
        step = it.get_prev if backward else it.get_next
        while True:
            try:
                yield step(datetime)
            except (CroniterBadDateError, OverflowError):
                return  # past year 1 or 9999: far outside the int64 range our callers stop at

    def _iter_after(self, t_ns: int) -> Iterator[int]:
        """Distinct boundaries strictly after ``t_ns`` in increasing order (within int64)."""
        if t_ns >= MAX_BOUNDARY_NS:
            return
        t_ns = max(t_ns, MIN_BOUNDARY_NS)
        # Starting from the wall minute of t is enough: resolution is monotone in wall time, and a
        # t in the second half of a repeat just skips the fold=0 instants that are already past.
        start = self._wall(t_ns // NS_PER_S).replace(tzinfo=None, second=0, microsecond=0)
        last = t_ns
        for wall in self._walls(start, backward=False):
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
        for candidate in self._walls(start, backward=True):
            instant = self._resolve(candidate) * NS_PER_S
            if instant < MIN_BOUNDARY_NS:
                return None
            if instant <= t_ns:
                return instant
        return None

    def count_between(self, after_ns: int, until_ns: int) -> int:
        """Number of boundaries in ``(after_ns, until_ns]``.

        Cost is proportional to the number of *days* in the window, not to the number of
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
        day = self._wall(first // NS_PER_S).date() - _ONE_DAY
        end_day = self._wall(last // NS_PER_S).date() + _ONE_DAY
        window = _Window(first, last)
        # The next midnight's resolution is reused when consecutive days match (most schedules).
        cached_day: date | None = None
        cached_start = 0
        while day <= end_day:
            if not fields.day_matches(day):
                day += _ONE_DAY
                continue
            midnight = datetime(day.year, day.month, day.day)
            day_start = cached_start if day == cached_day else self._resolve(midnight)
            if day_start * NS_PER_S > last:
                break
            next_midnight = midnight + _ONE_DAY
            # 24 real hours after midnight it is midnight again iff no transition happened that day
            # (one astimezone instead of resolving both fold variants).
            probe = self._wall(day_start + 86400)
            regular = probe.fold == 0 and probe.replace(tzinfo=None) == next_midnight
            day += _ONE_DAY
            cached_day = day
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
        check_limit(limit)
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
