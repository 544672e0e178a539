"""What a tick plans for the schedules themselves: resets, and the boundaries that are due.

Both steps write into the tick's :class:`~streamsched.schedules.checkpoint.TickCheckpoint`;
feedback (:mod:`streamsched.schedules.feedback`) and operator requests
(:mod:`streamsched.schedules.requests`) are the tick's other steps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from streamsched.model.overlap import admit, release
from streamsched.model.schedule import OVERLAP, Definition, HistoryRow, ScheduleStatus, State, fresh_state
from streamsched.model.specs import At, plan_catch_up
from streamsched.schedules.checkpoint import TickCheckpoint


def reset(defs: Mapping[str, Definition], ckpt: TickCheckpoint) -> None:
    """A new or changed definition (a new version) gets a fresh state; a held schedule stays held
    until its definition is newer than the version held; a deleted schedule's state is dropped."""
    for name, defn in defs.items():
        if name in ckpt.held:
            version = ckpt.held[name]
            if version is not None and defn.version <= version:
                continue  # needs attention: never reset silently
            del ckpt.held[name]  # a newer version resets it, as any version change does
        st = ckpt.states.get(name)
        if st is None or st.version != defn.version:
            ckpt.put(fresh_state(defn, ckpt.now, fence=ckpt.fence, previous=st))
    for name in [n for n in ckpt.held if n not in defs]:
        del ckpt.held[name]  # deleted: drop its corrupt state record too
        ckpt.delete(name)
    for name in [n for n in ckpt.states if n not in defs]:
        ckpt.delete(name)


async def fire_due(defs: Mapping[str, Definition], ckpt: TickCheckpoint, *, limit: int,
                   writable: Callable[[str], Awaitable[bool]]) -> None:
    """Fire each active schedule's boundaries due by the tick's time under its catch-up and
    overlap policies and advance it, until the transaction holds ``limit`` occurrences (the rest
    fire next tick). A boundary its overlap policy held fires once the run before it resolved. A
    schedule whose target cannot be written waits, unchanged (:mod:`streamsched.schedules.targets`)."""
    now = ckpt.now
    for name, st in list(ckpt.states.items()):
        if st.status is not ScheduleStatus.ACTIVE or ckpt.fired >= limit:
            continue
        due = st.next_planned_ns is not None and st.next_planned_ns <= now
        held, running = release(st.running)
        if not due and held is None:
            continue
        defn = defs[name]
        if not await writable(defn.target_topic):
            continue
        fired = [held] if held is not None else []
        skipped = 0
        anchor, upcoming = st.anchor_ns, st.next_planned_ns
        if held is not None:
            st = _fire(ckpt, defn, st, held)
        if due:
            plan = plan_catch_up(defn.parsed(), st.anchor_ns, now, policy=defn.policy)
            admitted = admit(defn.overlap, running, plan.fire)
            for planned in admitted.fire:
                st = _fire(ckpt, defn, st, planned)
            if admitted.row is not None:
                st = ckpt.record(st, HistoryRow(defn.schedule_id, f"{defn.schedule_id}/{admitted.row}",
                                                admitted.row, 0, "SKIPPED", now, OVERLAP, OVERLAP))
            fired += admitted.fire
            skipped = plan.skipped + len(admitted.skipped)
            ckpt.skipped_by_overlap += len(admitted.skipped)
            running = admitted.running
            # Past every due boundary, whether it fired, waits in the buffer or was skipped.
            anchor = plan.fire[-1] if plan.fire else max(st.anchor_ns, now)
            upcoming = plan.next_planned_ns
        last = max((t for t in (*fired, st.last_fired_ns) if t is not None), default=None)
        if isinstance(defn.parsed(), At):
            upcoming = None  # a one-time job has no next boundary once it fired
        ckpt.put(st.advanced(anchor_ns=anchor, next_planned_ns=upcoming, last_fired_ns=last,
                             fired=st.fired + len(fired), skipped=st.skipped + skipped,
                             running=running, fence=ckpt.fence))


def _fire(ckpt: TickCheckpoint, defn: Definition, st: State, planned: int) -> State:
    """Write the occurrence of ``defn`` planned at ``planned`` and its ``RUNNING`` history row."""
    ckpt.fire(defn, planned)
    return ckpt.record(st, HistoryRow(defn.schedule_id, f"{defn.schedule_id}/{planned}", planned, 1,
                                      "RUNNING", ckpt.now))
