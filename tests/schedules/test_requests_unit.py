"""Operator requests (trigger, backfill) applied by the ticker, on the in-memory Kafka.

Same seam as tests/schedules/test_ticker_unit.py: one ``PartitionTicker`` on a stand-in owner,
driven tick by tick with a controlled clock. A request is a record of the definitions topic
(as ``Catalog.trigger``/``backfill`` write it), delivered through the ticker's inbox. A restart
is a second ``PartitionTicker`` restored from what the fake cluster holds: the definitions
records, the committed states and the group's committed offsets.
"""

from __future__ import annotations

import pytest

from streamsched.errors import DecodeError
from streamsched.model.schedule import MANUAL, HistoryRow, Request, RequestProgress, ScheduleStatus
from streamsched.schedules import tick
from streamsched.schedules.book import ScheduleBook
from streamsched.schedules.ticker import PartitionTicker, fired_by_us
from streamsched.wire.schedule import (
    HISTORY_CODEC,
    MAX_PROGRESS,
    STATE_CODEC,
    decode_progress,
    encode_progress,
    encode_request,
    request_key,
)
from tests.schedules.test_ticker_unit import MINUTE, T0, TID, Rig, StandInOwner, at_spec

S = 1_000_000_000


def request(rig: Rig, req: Request, pt: PartitionTicker | None = None) -> int:
    """Write ``req`` as Catalog does and hand it to the ticker's intake; returns its offset."""
    rec = rig.kafka.produce(rig.catalog.definitions_topic, encode_request(req),
                            key=request_key(req.name, req.request_id).encode(), partition=0)
    (pt or rig.pt).inbox.append(rec)
    return int(rec.offset)


def trigger(at_ns: int, rid: str = "a" * 32, version: int = 1, name: str = "every") -> Request:
    return Request("trigger", name, version, at_ns, rid)


def backfill(from_ns: int, to_ns: int, *, max: int = 64, rid: str = "b" * 32) -> Request:
    return Request("backfill", "every", 1, to_ns, rid, from_ns, to_ns, max)


def feedback(rig: Rig, row: HistoryRow, name: str = "every") -> None:
    rig.kafka.produce(rig.catalog.feedback_topic, HISTORY_CODEC.encode(row.to_record()), key=name.encode(),
                      partition=0)


def committed_requests(rig: Rig) -> int | None:
    return rig.kafka.committed(rig.catalog.group, rig.catalog.definitions_topic, 0)  # type: ignore[no-any-return]


async def restarted(rig: Rig) -> PartitionTicker:
    """A new owner of partition 0, restored from what the fake cluster holds through the book, as
    ``restore`` does it (every definitions and state record in log order, then the committed
    offsets)."""
    producer = rig.kafka.producer(TID)
    await producer.start()  # fences the previous owner
    metrics = rig.pt.ctx.metrics
    book = ScheduleBook(metrics, 0)
    definitions = rig.kafka.records(rig.catalog.definitions_topic)
    book.apply_definitions(definitions)
    book.apply_states(rig.kafka.records(rig.catalog.state_topic))
    book.restored(committed_requests(rig), max(r.offset for r in definitions) + 1)
    pt = PartitionTicker(rig.pt.ctx, StandInOwner(0, producer), book, rig.feedback(metrics))
    rig.pt = pt
    return pt


async def started(rig: Rig, *, minutes: int = 3) -> PartitionTicker:
    """``every`` (@every 1m) created at T0 and fired at T0+1m .. T0+minutes."""
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    rig.clock.now = T0 + minutes * MINUTE + S
    await pt.tick()
    assert [ev.due_ns for ev in rig.fired()] == [T0 + k * MINUTE for k in range(1, minutes + 1)]
    return pt


async def test_a_trigger_fires_once_with_its_own_identity_and_leaves_the_schedule_alone() -> None:
    rig = Rig()
    pt = await started(rig)
    before = rig.durable_state("every")
    at = T0 + 3 * MINUTE + 5 * S
    offset = request(rig, trigger(at))
    await pt.tick()
    ev = rig.fired()[-1]
    assert (ev.event_id, ev.due_ns, ev.origin) == (f"every.v1/{at}", at, f"sched:cat:every:1:{at}")
    st = rig.durable_state("every")
    assert (st.anchor_ns, st.next_planned_ns, st.last_fired_ns) == (
        before.anchor_ns, before.next_planned_ns, before.last_fired_ns)
    assert st.fired == before.fired + 1
    row = rig.history()[-1]
    assert (row.occurrence, row.state, row.manual, row.cause_category) == (ev.event_id, "RUNNING", "trigger",
                                                                           MANUAL)
    # The occurrence, its row, the state and the applied mark: one transaction.
    last = rig.kafka.transactions[-1]
    assert last.committed and len(last.on("jobs")) == 1
    assert last.offsets[rig.catalog.group][pt.defs_tp] == offset + 1
    await pt.tick()
    rig.clock.now += 10 * S
    await pt.tick()
    assert [e.event_id for e in rig.fired()].count(ev.event_id) == 1


async def test_a_manual_occurrences_feedback_is_trusted_and_a_forged_one_is_not() -> None:
    rig = Rig()
    pt = await started(rig)
    at = T0 + 3 * MINUTE + 5 * S
    request(rig, trigger(at))
    await pt.tick()
    st = pt.book.states["every"]
    defn = pt.book.defs["every"]
    real = HistoryRow("every.v1", f"every.v1/{at}", at, 1, "SUCCEEDED", at + S)
    forged = HistoryRow("every.v1", f"every.v1/{at + 1}", at + 1, 1, "SUCCEEDED", at + S)
    assert fired_by_us(st, defn, real, manual=pt.book.requests.manual(st))
    assert not fired_by_us(st, defn, forged, manual=pt.book.requests.manual(st))
    feedback(rig, real)
    feedback(rig, forged)
    await pt.tick()
    assert rig.history()[-1] == real
    assert pt.ctx.metrics.snapshot()["counters"]["feedback_rejected"] == 1


async def test_a_manual_run_of_a_one_time_job_does_not_end_it() -> None:
    rig = Rig()
    pt = await rig.start()
    at = T0 + 30 * MINUTE
    rig.define("once", at_spec(at))
    await pt.tick()
    manual_at = T0 + 5 * S
    request(rig, trigger(manual_at, name="once"))
    await pt.tick()
    assert [ev.due_ns for ev in rig.fired()] == [manual_at]
    done = HistoryRow("once.v1", f"once.v1/{manual_at}", manual_at, 1, "SUCCEEDED", manual_at + S)
    feedback(rig, done, "once")
    await pt.tick()
    st = rig.durable_state("once")
    assert (st.status, st.next_planned_ns) == (ScheduleStatus.ACTIVE, at)  # still due at its instant


async def test_a_backfill_fires_the_scheduled_identities_of_its_window_up_to_the_anchor() -> None:
    rig = Rig()
    pt = await started(rig, minutes=3)
    before = rig.durable_state("every")
    # The window reaches before the schedule existed and past its last planned boundary (T0+3m):
    # boundaries after the anchor are the ticker's own to plan, not the backfill's.
    request(rig, backfill(T0 - 2 * MINUTE, T0 + 3 * MINUTE + 30 * S))
    rig.clock.now = T0 + 3 * MINUTE + 40 * S
    await pt.tick()
    fired = [ev.event_id for ev in rig.fired()][3:]
    assert fired == [f"every.v1/{T0 + k * MINUTE}" for k in range(-2, 4)]
    st = rig.durable_state("every")
    assert (st.anchor_ns, st.next_planned_ns, st.last_fired_ns) == (
        before.anchor_ns, before.next_planned_ns, before.last_fired_ns)
    assert [r.manual for r in rig.history()[-6:]] == ["backfill"] * 6
    # A backfilled boundary from before the first fire is trusted feedback too.
    early = HistoryRow("every.v1", f"every.v1/{T0 - MINUTE}", T0 - MINUTE, 1, "SUCCEEDED", T0)
    assert fired_by_us(st, pt.book.defs["every"], early)
    await pt.tick()
    assert len(rig.fired()) == 9


async def test_a_backfill_stops_at_its_max_and_splits_over_transactions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tick, "MAX_FIRES_PER_TXN", 4)
    rig = Rig()
    pt = await started(rig, minutes=3)
    txns = len(rig.kafka.transactions)
    request(rig, backfill(T0 - 20 * MINUTE, T0, max=10))
    await pt.tick()
    assert pt.sleep_s() == 0.0  # more to fire: no sleep before the next tick
    await pt.tick()
    await pt.tick()
    await pt.tick()
    fired = [ev.due_ns for ev in rig.fired()][3:]
    assert fired == [T0 + k * MINUTE for k in range(-20, -10)]  # the first 10 of 21, in order
    assert len(rig.kafka.transactions) - txns == 3  # 4 + 4 + 2
    assert not pt.book.requests.pending() and not pt.more


async def test_a_request_survives_a_restart_before_its_commit_and_fires_once_after() -> None:
    from aiokafka.errors import KafkaError

    rig = Rig()
    pt = await started(rig)
    at = T0 + 3 * MINUTE + 5 * S
    request(rig, trigger(at))
    pt.producer.fail("commit_transaction", KafkaError("crash before the commit"))
    with pytest.raises(KafkaError):
        await pt.tick()
    assert f"every.v1/{at}" not in [ev.event_id for ev in rig.fired()]
    pt2 = await restarted(rig)
    assert [e.request.at_ns for _, e in pt2.book.requests.pending()] == [at]
    await pt2.tick()
    pt3 = await restarted(rig)  # and once applied, a restart does not fire it again
    assert not pt3.book.requests.pending()
    await pt3.tick()
    assert [ev.event_id for ev in rig.fired()].count(f"every.v1/{at}") == 1
    # The restored ticker still trusts the manual occurrence's feedback.
    assert pt3.book.requests.manual(pt3.book.states["every"]) == {at}


async def test_a_backfill_cut_off_by_a_restart_resumes_after_its_last_fired_boundary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.errors import KafkaError

    monkeypatch.setattr(tick, "MAX_FIRES_PER_TXN", 4)
    rig = Rig()
    pt = await started(rig, minutes=3)
    request(rig, backfill(T0 - 20 * MINUTE, T0, max=10))
    await pt.tick()  # the first 4, committed with the progress in the schedule's state
    pt.producer.fail("commit_transaction", KafkaError("crash before the commit"))
    with pytest.raises(KafkaError):
        await pt.tick()  # the next 4: never committed, so neither is their progress
    pt2 = await restarted(rig)
    [(_, entry)] = pt2.book.requests.pending()
    assert (entry.done_to, entry.fired) == (T0 - 17 * MINUTE, 4)
    for _ in range(3):
        await pt2.tick()
    backfilled = [T0 + k * MINUTE for k in range(-20, -10)]
    assert [ev.due_ns for ev in rig.fired()][3:] == backfilled  # each once, in order
    rows = [r.planned_ns for r in rig.history() if r.manual == "backfill"]
    assert rows == backfilled  # no duplicate history row
    pt3 = await restarted(rig)  # finished: a restart fires nothing of it again
    assert not pt3.book.requests.pending()
    await pt3.tick()
    assert len(rig.fired()) == 3 + 10


async def test_a_request_applied_after_one_that_waits_is_not_applied_again_after_a_restart() -> None:
    rig = Rig()
    pt = await started(rig)
    rig.define("bad", "@every 1h", target="nowhere")  # no such topic (or no ACL for it)
    await pt.tick()
    waiting = request(rig, trigger(T0 + 3 * MINUTE + 4 * S, rid="c" * 32, name="bad"))
    at = T0 + 3 * MINUTE + 5 * S
    request(rig, trigger(at))
    await pt.tick()
    assert committed_requests(rig) == waiting  # the committed offset stops at the waiting one
    pt2 = await restarted(rig)
    assert [e.request.name for _, e in pt2.book.requests.pending()] == ["bad"]
    await pt2.tick()
    assert [ev.event_id for ev in rig.fired()].count(f"every.v1/{at}") == 1
    assert pt2.book.requests.manual(pt2.book.states["every"]) == {at}  # its feedback stays trusted


def test_request_progress_round_trips_and_a_bad_header_is_refused() -> None:
    items = (RequestProgress("a" * 32, None, 1, True), RequestProgress("b" * 32, T0, 7, False))
    assert decode_progress(encode_progress(items)) == items
    too_many = [RequestProgress(f"{i:032x}", None, 1, True) for i in range(MAX_PROGRESS + 1)]
    for bad in (b"[]", b'{"x": {"done": true, "done_to": null, "fired": 1}}',
                b'{"%s": {"done": 1, "done_to": null, "fired": 1}}' % (b"a" * 32),
                b'{"%s": {"done": true, "done_to": null, "fired": -1}}' % (b"a" * 32),
                b'{"%s": {"done": true, "fired": 1}}' % (b"a" * 32),
                encode_progress(too_many)):
        with pytest.raises(DecodeError):
            decode_progress(bad)


async def test_an_unreadable_progress_header_is_counted_and_the_state_still_restores() -> None:
    rig = Rig()
    await started(rig)
    st = rig.durable_state("every")
    rig.kafka.produce(rig.catalog.state_topic, STATE_CODEC.encode(st.to_record()), key=b"every", partition=0,
                      headers=[("ss-version", b"1"), ("ss-requests", b"{not json")])
    pt = await restarted(rig)
    assert pt.book.states["every"] == st
    assert pt.ctx.metrics.snapshot()["counters"]["undecodable_records{kind=progress}"] == 1


async def test_bad_and_stale_requests_are_counted_and_skipped() -> None:
    rig = Rig()
    pt = await started(rig)
    junk = rig.kafka.produce(rig.catalog.definitions_topic, b'{"kind":"nuke"}',
                             key=request_key("every", "c" * 32).encode(), partition=0)
    pt.inbox.append(junk)
    request(rig, trigger(T0 + 10 * S, rid="d" * 32, version=7))  # another version's
    request(rig, trigger(T0 + 4 * MINUTE, rid="e" * 32))  # a boundary: not an identity of its own
    request(rig, trigger(T0 + 11 * S, rid="f" * 32, name="gone"))
    await pt.tick()
    assert len(rig.fired()) == 3  # nothing new
    counters = pt.ctx.metrics.snapshot()["counters"]
    assert counters["undecodable_records{kind=request}"] == 1
    assert counters["schedule_requests_dropped{reason=stale_version}"] == 1
    assert counters["schedule_requests_dropped{reason=boundary}"] == 1
    assert counters["schedule_requests_dropped{reason=no_schedule}"] == 1
    assert committed_requests(rig) == len(rig.kafka.records(rig.catalog.definitions_topic))
    assert "every" in pt.book.defs  # the definition is untouched by requests under its name
    assert STATE_CODEC.decode(rig.kafka.records(rig.catalog.state_topic)[-1].value or b"")


def test_the_client_deletes_only_applied_requests_it_no_longer_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.model.schedule import Definition
    from streamsched.schedules import manual

    monkeypatch.setattr(manual, "KEEP_REQUESTS", 2)
    defn = Definition(name="every", spec="@every 1m", target_topic="jobs", payload=b"{}", version=2,
                      enabled=True, policy="catch_up", created_ns=T0)
    stored = {f"k{i}": manual.Stored(0, i, trigger(T0 + i, rid=f"{i:032x}", version=2)) for i in range(5)}
    stored["old"] = manual.Stored(1, 0, trigger(T0, rid="f" * 32, version=1))  # an older version's
    stored["gone"] = manual.Stored(1, 1, trigger(T0, rid="e" * 32, name="gone"))
    # Partition 0 applied below offset 4: k4 is pending; k3 and k2 are the newest applied, kept.
    assert sorted(manual.stale({"every": defn}, stored, {0: 4, 1: 2})) == ["gone", "k0", "k1", "old"]
    assert manual.stale({"every": defn}, stored, {}) == []  # nothing known applied: nothing deleted
