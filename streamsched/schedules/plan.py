"""What a tick plans for the schedules themselves: resets, and the boundaries that are due.

Both steps write into the tick's :class:`~streamsched.schedules.checkpoint.TickCheckpoint`;
feedback (:mod:`streamsched.schedules.feedback`) and operator requests
(:mod:`streamsched.schedules.requests`) are the tick's other steps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from streamsched.model.schedule import Definition, HistoryRow, ScheduleStatus, fresh_state
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
    """Fire each active schedule's boundaries due by the tick's time under its catch-up policy and
    advance it, until the transaction holds ``limit`` occurrences (the rest fire next tick). A
    schedule whose target cannot be written waits, unchanged (:mod:`streamsched.schedules.targets`)."""
    now = ckpt.now
    for name, st in list(ckpt.states.items()):
        if (st.status is not ScheduleStatus.ACTIVE or st.next_planned_ns is None
                or st.next_planned_ns > now or ckpt.fired >= limit):
            continue
        defn = defs[name]
        if not await writable(defn.target_topic):
            continue
        plan = plan_catch_up(defn.parsed(), st.anchor_ns, now, policy=defn.policy)
        for planned in plan.fire:
            ckpt.fire(defn, planned)
            st = ckpt.record(st, HistoryRow(defn.schedule_id, f"{defn.schedule_id}/{planned}", planned, 1,
                                            "RUNNING", now))
        st = st.advanced(anchor_ns=plan.fire[-1] if plan.fire else max(st.anchor_ns, now),
                         next_planned_ns=plan.next_planned_ns,
                         last_fired_ns=plan.fire[-1] if plan.fire else st.last_fired_ns,
                         fired=st.fired + len(plan.fire), skipped=st.skipped + plan.skipped,
                         fence=ckpt.fence)
        if isinstance(defn.parsed(), At):
            st = st.advanced(next_planned_ns=None)
        ckpt.put(st)
