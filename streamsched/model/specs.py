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

    croniter matches the fields; the grammar check, the wall-time-to-instant rules above and the
    counting are ours (:mod:`streamsched.model.cron` says why and what it costs).

All boundaries are integer nanoseconds since the epoch and lie in the signed 64-bit range
(1677-09-21..2262-04-11); beyond it ``next_after`` returns ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeAlias

from streamsched.errors import ConfigError, InvalidSpec
from streamsched.model import limits
from streamsched.model.cron import Cron, load_zone
from streamsched.model.instants import MAX_BOUNDARY_NS, MIN_BOUNDARY_NS, NS_PER_S, check_limit, quote_token

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
        check_limit(limit)
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
        check_limit(limit)
        return [self.at_ns] if limit >= 1 and self.count_between(after_ns, until_ns) else []


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
        raise InvalidSpec(f"interval {quote_token(token)} must look like <n><unit>, e.g. 30s, 5m, 1h")
    digits, unit = match.groups()
    if unit in _CALENDAR_UNITS:
        raise InvalidSpec("calendar months and years are not intervals")
    if unit not in _UNIT_NS:
        raise InvalidSpec(f"unknown interval unit {quote_token(unit)} (use s, m, h, d or w)")
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
        raise InvalidSpec(
            f"timestamp {quote_token(token)} is not RFC 3339, expected e.g. 2026-12-02T10:00:00Z"
        )
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
    at_ns = ((civil - _EPOCH) // _ONE_SECOND - offset_s) * NS_PER_S + frac_ns
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
        load_zone(timezone)
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
            f"unknown directive {quote_token(head)}; expected @every, @at or a five-field cron expression"
        )
    return Cron(" ".join(tokens), timezone if timezone is not None else "UTC")


# ---------------------------------------------------------------------------------------------------
# catch-up


@dataclass(frozen=True, slots=True)
class CatchUpPlan:
    """What to do after downtime: fire the boundaries in ``fire`` now, in order; add ``skipped``
    to the schedule's skipped count (those boundaries never fire and get no history row); plan the
    next timer at ``next_planned_ns`` (``None``: the spec never fires again). For every plan
    ``len(fire) + skipped`` is the number of due boundaries."""

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

    The *due* (missed) boundaries are those in ``(last_planned_ns, now_ns]``: after the last one
    already planned, up to and including ``now_ns``; say there are ``D`` of them and
    ``M = max_catch_up`` (64 by default).

    * ``policy="catch_up"``: the first ``M`` due boundaries fire in order, then the schedule skips
      forward to the **latest** due boundary, which **also fires** (it is the current occurrence,
      not a catch-up). Exactly: if ``D <= M + 1`` all ``D`` fire and nothing is skipped; otherwise
      ``M + 1`` fire (the first ``M`` and the latest) and the ``D - M - 1`` in between are skipped.
    * ``policy="coalesce"``: only the latest due boundary fires; the other ``D - 1`` are skipped.

    With the default ``M = 64``::

        due D    catch_up: fired  skipped     coalesce: fired  skipped
           63                63        0                    1       62
           64                64        0                    1       63
           65                65        0                    1       64
           66                65        1                    1       65
          100                65       35                    1       99

    So one run after a long outage fires at most 65 occurrences of a schedule.

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
