"""The operator requests (trigger, backfill, pause, resume) one catalog partition's ticker knows of.

Requests are records of the definitions topic (key ``<name>\\x00request/<id>``,
:mod:`streamsched.wire.schedule`), written by whoever may write the catalog; the ticker never
writes that topic. What it has applied is one offset per partition: the ticker group's committed
offset of the definitions partition, moved in the same transaction that fires a request's
occurrences. Every request below it is applied (or was dropped); every one at or above it is
pending, so a ticker that restarts between a request and its fire fires it then, once.

A request stays in the topic after it is applied (the catalog client deletes old ones when it
writes the next), and the ticker keeps the applied triggers of each schedule: that is how it
knows a manual occurrence's feedback is for an occurrence it fired (:meth:`Requests.manual`).

A backfill larger than one transaction's share continues in the next ticks (``done_to``). The
committed offset cannot say how far it got, nor that a request after one that still waits (its
schedule's target cannot be written now, :mod:`streamsched.schedules.targets`) was applied: it
stops at the first pending one. So every state the ticker writes carries the progress of its
schedule's requests at or above that offset (:class:`~streamsched.model.schedule.RequestProgress`,
a header of the state record), in the transaction that fires them: a restarted ticker resumes a
backfill after its last fired boundary and does not apply a finished request again
(:meth:`Requests.resume`). Only the newest :data:`~streamsched.wire.schedule.MAX_PROGRESS` of one
schedule are kept; an older one, and one whose progress header cannot be read, is applied again
from its start, with the same identities, which target workers resolve from their stored outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from streamsched.metrics import Metrics
from streamsched.model.overlap import IDLE
from streamsched.model.schedule import (
    MANUAL,
    Definition,
    HistoryRow,
    Request,
    RequestProgress,
    ScheduleStatus,
    State,
)
from streamsched.model.specs import At
from streamsched.wire.schedule import MAX_PROGRESS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    offset: int
    request: Request
    applied: bool = False
    done_to: int | None = None
    """A backfill's last boundary fired so far, or None."""
    fired: int = 0
    """Occurrences a backfill fired so far; it stops at its ``max``."""

    def progress(self) -> RequestProgress:
        return RequestProgress(self.request.request_id, self.done_to, self.fired, self.applied)


class Requests:
    """Requests of one partition by key, and the offset below which all are applied."""

    def __init__(self) -> None:
        self.by_key: dict[str, Entry] = {}
        self.applied_to = 0
        """The committed offset: every request below it is applied."""

    def put(self, key: str, offset: int, request: Request) -> None:
        self.by_key[key] = Entry(offset, request, applied=offset < self.applied_to)

    def remove(self, key: str) -> None:
        """A deleted request (the catalog client's clean-up, or an operator's cancel)."""
        self.by_key.pop(key, None)

    def restored(self, committed: int | None) -> None:
        """Mark what the committed offset says is applied (after the restore read them all)."""
        self.applied_to = committed or 0
        for key, e in self.by_key.items():
            if e.offset < self.applied_to:
                self.by_key[key] = replace(e, applied=True)

    def resume(self, progress: Mapping[str, Mapping[str, RequestProgress]]) -> None:
        """Take up what the restored states say of the pending requests (``progress`` by
        schedule name, then request id): a finished one is applied, a backfill resumes."""
        for key, e in self.by_key.items():
            done = progress.get(e.request.name, {}).get(e.request.request_id)
            if not e.applied and done is not None:
                self.by_key[key] = replace(e, applied=done.done, done_to=done.done_to, fired=done.fired)

    def progress(self, updates: Mapping[str, Entry], covered_to: int) -> dict[str, list[RequestProgress]]:
        """What a state written now carries, by schedule name: the progress of its requests (as
        ``updates`` leave them) that the committed offset ``covered_to`` does not cover, the
        newest :data:`MAX_PROGRESS` (module docs)."""
        uncovered = sorted((e for e in {**self.by_key, **updates}.values()
                            if e.offset >= covered_to and (e.applied or e.fired)), key=lambda e: e.offset)
        out: dict[str, list[RequestProgress]] = {}
        for e in uncovered:
            out.setdefault(e.request.name, []).append(e.progress())
        return {name: items[-MAX_PROGRESS:] for name, items in out.items()}

    def pending(self) -> list[tuple[str, Entry]]:
        """The requests not applied yet, in log order."""
        return sorted(((k, e) for k, e in self.by_key.items() if not e.applied), key=lambda t: t[1].offset)

    def manual(self, st: State) -> frozenset[int]:
        """The planned times of the applied triggers of ``st``'s schedule and version."""
        return frozenset(e.request.at_ns for e in self.by_key.values()
                         if e.applied and e.request.kind == "trigger" and e.request.name == st.name
                         and e.request.version == st.version)

    def watermark(self, updates: dict[str, Entry], consumed_to: int) -> int:
        """Where the committed offset may move once ``updates`` are durable: the first request
        still pending, or everything read so far."""
        pending = [e.offset for k, e in self.by_key.items() if not updates.get(k, e).applied]
        return min(pending, default=consumed_to)


def problem(req: Request, defn: Definition | None, st: State | None, held: bool) -> str | None:
    """Why ``req`` cannot be applied (it is then dropped; a metric reason), or None. A pause or
    resume applies to whatever version is current."""
    if defn is None or st is None:
        return "no_schedule"
    if held:
        return "held"
    if req.kind == "pause":
        return None if st.status in (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED) else "not_active"
    if req.kind == "resume":
        return None if st.status is ScheduleStatus.PAUSED else "not_paused"
    if req.version != defn.version or st.version != defn.version:
        return "stale_version"
    if req.kind == "trigger" and is_boundary(defn, req.at_ns):
        return "boundary"
    return None


def is_boundary(defn: Definition, t_ns: int) -> bool:
    spec = defn.parsed()
    if isinstance(spec, At):
        return spec.at_ns == t_ns
    return spec.latest_at_or_before(t_ns) == t_ns


def backfill_window(req: Request, entry: Entry, st: State, now_ns: int) -> tuple[int, int] | None:
    """The ``(after, until]`` of boundaries left to fire for a backfill: never past the
    schedule's anchor (later boundaries are the ticker's own to plan) nor past now."""
    assert req.from_ns is not None and req.to_ns is not None
    after = entry.done_to if entry.done_to is not None else req.from_ns - 1
    until = min(req.to_ns, st.anchor_ns, now_ns)
    return (after, until) if until > after else None


@dataclass
class Batch:
    """What one tick lends the requests: its clock, its share of the transaction and its writers."""

    now: int
    fired: int
    """Occurrences already in this transaction."""
    limit: int
    fence: int
    put: Callable[[State], None]
    record: Callable[[State, HistoryRow], State]
    fire: Callable[[Definition, int], None]
    """Write the occurrence of a definition planned at a time."""
    writable: Callable[[str], Awaitable[bool]]
    more: bool = field(default=False)
    """A request has more to fire than this transaction took."""


async def apply_pending(requests: Requests, defs: Mapping[str, Definition], states: Mapping[str, State],
                        held: Mapping[str, object], metrics: Metrics, b: Batch) -> dict[str, Entry]:
    """Fire the pending requests' occurrences into ``b`` in log order; returns their new entries
    (durable with the transaction). A request whose target cannot be written waits, as its
    schedule does; one that cannot be applied is dropped, counted and logged."""
    updates: dict[str, Entry] = {}
    for key, entry in requests.pending():
        req = entry.request
        defn, st = defs.get(req.name), states.get(req.name)
        why = problem(req, defn, st, req.name in held)
        if why is not None:
            metrics.inc("schedule_requests_dropped", reason=why)
            log.warning("dropped the %s request %s of schedule %r (%s)", req.kind, req.request_id,
                        req.name, why)
            updates[key] = replace(entry, applied=True)
            continue
        assert defn is not None and st is not None
        if req.kind in ("pause", "resume"):
            # Fires nothing: the anchor stays where it is, so a resume catches up from there.
            status = ScheduleStatus.PAUSED if req.kind == "pause" else ScheduleStatus.ACTIVE
            if st.status is not status:
                # A resume lets go of the run the overlap policy waited on (and the held boundary):
                # the operator's way out when a run will never report (module docs of model.overlap).
                running = IDLE if req.kind == "resume" else st.running
                b.put(st.advanced(status=status, running=running, fence=b.fence))
            log.info("schedule %r %sd (request %s)", req.name, req.kind, req.request_id)
            updates[key] = replace(entry, applied=True)
            continue
        if b.fired >= b.limit:
            b.more = True
            break
        if not await b.writable(defn.target_topic):
            continue
        if req.kind == "trigger":
            planned, done = [req.at_ns], replace(entry, applied=True)
        else:
            room = min(b.limit - b.fired, req.max - entry.fired)
            window = backfill_window(req, entry, st, b.now)
            planned = defn.parsed().boundaries(*window, room + 1) if window and room > 0 else []
            # Done when nothing is left in the window, or when its max is reached.
            finished = len(planned) <= room or room == req.max - entry.fired
            planned = planned[:room]
            b.more = b.more or not finished
            done = replace(entry, applied=finished, fired=entry.fired + len(planned),
                           done_to=planned[-1] if planned else entry.done_to)
        for t in planned:
            b.fire(defn, t)
            st = b.record(st, HistoryRow(defn.schedule_id, f"{defn.schedule_id}/{t}", t, 1, "RUNNING", b.now,
                                         req.kind, MANUAL))
        if planned:
            # A backfilled boundary counts as fired for the feedback trust rule (fired_by_us); the
            # anchor and the next boundary stay the schedule's own.
            last = st.last_fired_ns
            if req.kind == "backfill":
                last = max(planned[-1], last if last is not None else planned[-1])
            b.put(st.advanced(fired=st.fired + len(planned), last_fired_ns=last, fence=b.fence))
        b.fired += len(planned)
        updates[key] = done
    return updates
