"""The client side of operator requests: what ``Catalog.trigger``, ``backfill``, ``pause`` and
``resume`` ask for, the bounds they check first, and which applied requests the next write deletes.

Pure: :class:`~streamsched.schedules.catalog.Catalog` reads the definitions topic and the
ticker group's committed offsets, and writes what is decided here. The ticker's side is
:mod:`streamsched.schedules.requests`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamsched.errors import BoundExceeded, ConfigError
from streamsched.model.schedule import MAX_BACKFILL, MAX_REASON, Definition, Request, ScheduleStatus, State
from streamsched.model.specs import At
from streamsched.wire.control import printable

KEEP_REQUESTS = 16
"""Applied requests of each kind kept per schedule (the ticker trusts feedback for the triggers
among them); older ones are deleted by the next request's write."""


class BackfillTooLarge(BoundExceeded):
    """A backfill window holds more occurrences than the request may ask for (``--max``)."""

    def __init__(self, name: str, count: int, limit: int) -> None:
        super().__init__("backfill occurrences", limit, count)
        self.args = (f"the backfill of {name!r} covers {count} occurrences, more than its max {limit}: "
                     f"narrow the window or raise --max (at most {MAX_BACKFILL})",)


@dataclass(frozen=True)
class Receipt:
    """What a trigger or backfill asked for: the request id and the occurrences it names."""

    name: str
    schedule_id: str
    kind: str
    request_id: str | None
    """None for a dry run (nothing was written)."""
    occurrences: list[str] = field(default_factory=list)
    count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "schedule_id": self.schedule_id, self.kind: True,
                "request": self.request_id, "count": self.count, "occurrences": self.occurrences}


@dataclass(frozen=True)
class Stored:
    """A request as read back from the definitions topic."""

    partition: int
    offset: int
    request: Request


def trigger(defn: Definition, at_ns: int | None) -> tuple[Request, Receipt]:
    """One run of ``defn`` as ``<schedule-id>/<at_ns>`` (default now), moved by 1 ns off a
    boundary of the spec, so it never is a scheduled occurrence."""
    at = time.time_ns() if at_ns is None else at_ns
    spec = defn.parsed()
    if (spec.at_ns if isinstance(spec, At) else spec.latest_at_or_before(at)) == at:
        at += 1
    req = Request("trigger", defn.name, defn.version, at, uuid.uuid4().hex)
    occurrence = f"{defn.schedule_id}/{at}"
    return req, Receipt(defn.name, defn.schedule_id, "trigger", req.request_id, [occurrence], 1)


def check_window(from_ns: int, to_ns: int, max: int, now_ns: int) -> None:
    """The bounds a backfill is checked against before the catalog is read."""
    if not 1 <= max <= MAX_BACKFILL:
        raise BoundExceeded("backfill --max", MAX_BACKFILL, max)
    if from_ns > to_ns:
        raise ConfigError("backfill: --from is after --to")
    if to_ns > now_ns:
        raise ConfigError("backfill: --to is in the future (future occurrences are the ticker's to fire)")


def backfill(defn: Definition, from_ns: int, to_ns: int, max: int, *,
             dry_run: bool) -> tuple[Request | None, Receipt]:
    """Every boundary of ``defn`` in ``[from_ns, to_ns]``, with its scheduled identity; more than
    ``max`` is :class:`BackfillTooLarge`. ``dry_run``: no request, only the receipt."""
    spec = defn.parsed()
    count = spec.count_between(from_ns - 1, to_ns)
    if count > max:
        raise BackfillTooLarge(defn.name, count, max)
    occurrences = [f"{defn.schedule_id}/{t}" for t in spec.boundaries(from_ns - 1, to_ns, count)]
    if dry_run:
        return None, Receipt(defn.name, defn.schedule_id, "backfill", None, occurrences, count)
    req = Request("backfill", defn.name, defn.version, time.time_ns(), uuid.uuid4().hex, from_ns, to_ns, max)
    return req, Receipt(defn.name, defn.schedule_id, "backfill", req.request_id, occurrences, count)


def hold(defn: Definition, state: State | None, *, pause: bool,
         reason: str = "") -> tuple[Request | None, Receipt]:
    """A pause (``pause``) or resume request of ``defn``; None (nothing to write) when it already
    is paused (or active). :class:`ConfigError` for a schedule that is disabled or ended."""
    kind: Literal["pause", "resume"] = "pause" if pause else "resume"
    if not defn.enabled:
        status = ScheduleStatus.DISABLED  # whatever its state says until the ticker resets it
    else:
        status = state.status if state is not None else ScheduleStatus.ACTIVE
    wanted = ScheduleStatus.PAUSED if pause else ScheduleStatus.ACTIVE
    if status is wanted:
        return None, Receipt(defn.name, defn.schedule_id, kind, None)
    if pause and status is not ScheduleStatus.ACTIVE:
        raise ConfigError(f"schedule {defn.name!r} is {status.value}: only an active schedule can be paused")
    if not pause and status is not ScheduleStatus.PAUSED:
        raise ConfigError(f"schedule {defn.name!r} is {status.value}, not paused")
    req = Request(kind, defn.name, defn.version, time.time_ns(), uuid.uuid4().hex,
                  reason=printable(reason, MAX_REASON) if pause else "")
    return req, Receipt(defn.name, defn.schedule_id, kind, req.request_id)


def stale(defs: Mapping[str, Definition], requests: Mapping[str, Stored],
          applied: Mapping[int, int]) -> list[str]:
    """Keys of the requests to delete: applied (below their partition's ``applied`` offset) and
    either for a schedule that is gone, a trigger or backfill of a version that is gone, or older
    than the newest :data:`KEEP_REQUESTS` applied ones of their schedule and kind. A pending
    request is never deleted."""
    out: list[str] = []
    kept: dict[tuple[str, str], int] = {}
    for key, r in sorted(requests.items(), key=lambda kv: -kv[1].offset):  # newest first
        if r.offset >= applied.get(r.partition, 0):
            continue
        req = r.request
        defn = defs.get(req.name)
        # Counted per kind: pauses and resumes never push out the triggers the ticker trusts
        # feedback for. They hold for whatever version is current, so a new version keeps them
        # (a paused schedule's reason with them).
        kind = (req.name, req.kind)
        kept[kind] = kept.get(kind, 0) + 1
        stale_version = req.kind in ("trigger", "backfill") and defn is not None and \
            defn.version != req.version
        if defn is None or stale_version or kept[kind] > KEEP_REQUESTS:
            out.append(key)
    return out
