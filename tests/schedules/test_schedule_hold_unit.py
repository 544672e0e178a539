"""Pausing and resuming one schedule, and its overlap policy, applied by the ticker on the
in-memory Kafka.

Same seam as tests/schedules/test_ticker_unit.py and tests/schedules/test_requests_unit.py: one
``PartitionTicker`` on a stand-in owner, driven tick by tick with a controlled clock; requests
and definitions delivered through its inbox as the catalog writes them; a target worker's
results delivered on the feedback topic; a restart restored from what the fake cluster holds.
The real-broker proof, with a worker counting its calls, is
tests/schedules/test_schedule_hold.py.
"""

from __future__ import annotations

from dataclasses import replace

from streamsched.model.overlap import Overlap, Running
from streamsched.model.schedule import OVERLAP, Definition, HistoryRow, Request, ScheduleStatus, State
from streamsched.schedules.listing import read_state
from streamsched.schedules.ticker import PartitionTicker
from streamsched.wire.schedule import DEFINITION_CODEC, definition_headers
from tests.schedules.test_requests_unit import feedback, request, restarted
from tests.schedules.test_ticker_unit import MINUTE, T0, TARGET, Rig, at_spec

S = 1_000_000_000


def hold(kind: str, rid: str, *, name: str = "every", reason: str = "") -> Request:
    return Request(kind, name, 1, T0, rid, reason=reason)  # type: ignore[arg-type]


def define(rig: Rig, name: str, overlap: Overlap, *, spec: str = "@every 1m") -> Definition:
    defn = Definition(name=name, spec=spec, target_topic=TARGET, payload=b"{}", version=1, enabled=True,
                      policy="catch_up", created_ns=T0, overlap=overlap)
    rec = rig.kafka.produce(rig.catalog.definitions_topic, DEFINITION_CODEC.encode(defn.to_record()),
                            key=name.encode(), partition=0, headers=definition_headers(defn) or ())
    rig.pt.inbox.append(rec)
    return defn


def result(rig: Rig, name: str, planned: int, state: str = "SUCCEEDED") -> None:
    """The target worker reports the occurrence's terminal result."""
    feedback(rig, HistoryRow(f"{name}.v1", f"{name}.v1/{planned}", planned, 1, state, planned + S),  # type: ignore[arg-type]
             name=name)


def durable(rig: Rig, name: str) -> State:
    """The schedule's newest state record, its overlap tracking (a header) included."""
    return read_state([r for r in rig.kafka.records(rig.catalog.state_topic) if r.key == name.encode()][-1])


def due(rig: Rig, name: str) -> list[int]:
    return [ev.due_ns for ev in rig.fired() if ev.event_id.startswith(f"{name}.v1/")]


async def test_a_paused_schedule_fires_nothing_and_resumes_from_where_it_was() -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    rig.clock.now = T0 + MINUTE + S
    await pt.tick()
    request(rig, hold("pause", "a" * 32, reason="maintenance"))
    await pt.tick()
    st = durable(rig, "every")
    assert (st.status, st.anchor_ns, st.version) == (ScheduleStatus.PAUSED, T0 + MINUTE, 1)
    rig.clock.now = T0 + 5 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE]
    assert pt.sleep_s() == 0.2  # a paused schedule is no boundary to wake up for

    pt = await restarted(rig)  # the pause is durable: a new owner starts paused
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE]
    request(rig, hold("resume", "b" * 32), pt)
    await pt.tick()  # applied after the tick's own fires
    assert durable(rig, "every").status is ScheduleStatus.ACTIVE
    await pt.tick()
    # The missed boundaries fire under the catch-up policy, with the version's own identities.
    assert due(rig, "every") == [T0 + k * MINUTE for k in range(1, 6)]
    st = durable(rig, "every")
    assert (st.version, st.fired, st.skipped, st.next_planned_ns) == (1, 5, 0, T0 + 6 * MINUTE)


async def test_a_new_version_of_a_paused_schedule_stays_paused_and_requests_that_change_nothing_are_dropped(
        ) -> None:
    rig = Rig()
    pt = await rig.start()
    defn = rig.define("every", "@every 1m")
    await pt.tick()
    request(rig, hold("resume", "a" * 32))  # not paused: dropped, counted
    request(rig, hold("pause", "b" * 32))
    request(rig, hold("pause", "c" * 32))  # already paused: applied, changes nothing
    await pt.tick()
    assert durable(rig, "every").status is ScheduleStatus.PAUSED
    dropped = pt.ctx.metrics.snapshot()["counters"]
    assert dropped == {**dropped, "schedule_requests_dropped{reason=not_paused}": 1}
    new = replace(defn, version=2, spec="@every 2m")
    rec = rig.kafka.produce(rig.catalog.definitions_topic, DEFINITION_CODEC.encode(new.to_record()),
                            key=b"every", partition=0)
    pt.inbox.append(rec)
    rig.clock.now = T0 + 10 * MINUTE + S
    await pt.tick()
    st = durable(rig, "every")
    assert (st.version, st.status) == (2, ScheduleStatus.PAUSED) and rig.fired() == []


async def test_skip_fires_nothing_beside_an_unresolved_run() -> None:
    rig = Rig()
    pt = await rig.start()
    define(rig, "every", "skip")
    await pt.tick()
    rig.clock.now = T0 + MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE]
    assert durable(rig, "every").running == Running(pending_ns=T0 + MINUTE)
    rig.clock.now = T0 + 4 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE]
    st = durable(rig, "every")  # the tracking is durable (a header of the state record)
    assert (st.skipped, st.running, st.next_planned_ns) == (3, Running(T0 + MINUTE, None, 3), T0 + 5 * MINUTE)
    [skip_row] = [r for r in rig.history() if r.state == "SKIPPED"]  # one row for the run's skips
    assert (skip_row.planned_ns, skip_row.attempt, skip_row.cause_kind) == (T0 + 2 * MINUTE, 0, OVERLAP)
    assert pt.ctx.metrics.snapshot()["counters"]["overlap_skipped"] == 3

    result(rig, "every", T0 + MINUTE)
    await pt.tick()
    assert durable(rig, "every").running == Running()
    assert due(rig, "every") == [T0 + MINUTE]  # nothing held: the next boundary fires on time
    rig.clock.now = T0 + 5 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE, T0 + 5 * MINUTE]


async def buffering(minutes: int) -> tuple[Rig, PartitionTicker]:
    """``every`` (@every 1m, buffer_one) created at T0, ticked ``minutes`` later: 1m fired (and
    unresolved), 2m held, any later boundary skipped."""
    rig = Rig()
    pt = await rig.start()
    define(rig, "every", "buffer_one")
    await pt.tick()
    rig.clock.now = T0 + minutes * MINUTE + S
    await pt.tick()
    return rig, pt


async def test_buffer_one_fires_the_held_boundary_once_the_run_resolves_even_after_a_restart() -> None:
    rig, pt = await buffering(3)
    assert due(rig, "every") == [T0 + MINUTE]
    assert durable(rig, "every").running == Running(T0 + MINUTE, T0 + 2 * MINUTE, 1)

    pt = await restarted(rig)
    result(rig, "every", T0 + MINUTE, "FAILED")  # a terminal failure resolves the run too
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE, T0 + 2 * MINUTE]  # late, with its own identity
    st = durable(rig, "every")
    assert (st.running, st.fired, st.skipped, st.last_fired_ns) == (
        Running(pending_ns=T0 + 2 * MINUTE), 2, 1, T0 + 2 * MINUTE)
    result(rig, "every", T0 + 2 * MINUTE)
    rig.clock.now = T0 + 4 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + k * MINUTE for k in (1, 2, 4)]


async def test_allow_and_manual_runs_never_wait() -> None:
    rig = Rig()
    pt: PartitionTicker = await rig.start()
    define(rig, "every", "allow")
    define(rig, "other", "skip")
    await pt.tick()
    rig.clock.now = T0 + 3 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + k * MINUTE for k in (1, 2, 3)]
    assert durable(rig, "every").running == Running()
    at = T0 + 3 * MINUTE + 5 * S
    request(rig, Request("trigger", "other", 1, at, "d" * 32))
    await pt.tick()
    assert due(rig, "other") == [T0 + MINUTE, at]  # the trigger runs beside the unresolved run
    result(rig, "other", at)  # and its result resolves nothing of the schedule's own
    await pt.tick()
    assert durable(rig, "other").running.pending_ns == T0 + MINUTE


async def test_a_held_boundary_a_backfill_ran_is_let_go_and_a_resume_forgets_a_silent_run() -> None:
    rig, pt = await buffering(2)
    assert durable(rig, "every").running == Running(T0 + MINUTE, T0 + 2 * MINUTE, 0)
    # An operator backfills the held boundary and it runs: released later, it would resolve from
    # its stored outcome without a report, and the schedule would wait on it for ever.
    request(rig, Request("backfill", "every", 1, T0, "e" * 32, T0 + 2 * MINUTE, T0 + 2 * MINUTE, 1))
    await pt.tick()
    result(rig, "every", T0 + 2 * MINUTE)
    await pt.tick()
    assert durable(rig, "every").running == Running(pending_ns=T0 + MINUTE)
    # The run at 1m never reports (cancelled, say): pause and resume let go of it.
    request(rig, hold("pause", "f" * 32))
    request(rig, hold("resume", "0" * 32))
    await pt.tick()
    assert durable(rig, "every").running == Running()
    rig.clock.now = T0 + 3 * MINUTE + S
    await pt.tick()
    assert due(rig, "every") == [T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE]


async def test_a_one_time_job_paused_after_it_fired_still_ends_with_its_result() -> None:
    rig = Rig()
    pt = await rig.start()
    at = T0 + 30 * S
    rig.define("once", at_spec(at))
    await pt.tick()
    rig.clock.now = at + S
    await pt.tick()
    request(rig, hold("pause", "a" * 32, name="once"))
    await pt.tick()
    assert durable(rig, "once").status is ScheduleStatus.PAUSED
    result(rig, "once", at)
    await pt.tick()
    assert durable(rig, "once").status is ScheduleStatus.COMPLETED


def test_pauses_never_push_out_the_triggers_kept_for_feedback_and_outlive_a_new_version() -> None:
    from streamsched.schedules import manual

    defn = Definition(name="every", spec="@every 1m", target_topic=TARGET, payload=b"{}", version=2,
                      enabled=True, policy="catch_up", created_ns=T0)
    stored = {f"t{i}": manual.Stored(0, i, Request("trigger", "every", 2, T0 + i, f"{i:032x}"))
              for i in range(manual.KEEP_REQUESTS)}
    stored |= {f"p{i}": manual.Stored(0, 100 + i, hold("pause", f"{100 + i:032x}"))
               for i in range(manual.KEEP_REQUESTS + 2)}  # written for version 1
    assert sorted(manual.stale({"every": defn}, stored, {0: 1000})) == ["p0", "p1"]
