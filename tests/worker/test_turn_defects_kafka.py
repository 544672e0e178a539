"""Defects of the worker turn (issue 7, item 4) on a real broker: a malformed origin is a dead
letter, not a stalled partition (4a); a crash-looping item stops after MAX_DELIVERY_ATTEMPTS
deliveries (4b); feedback topics are looked up once (4g); corrupt state records are exported
(4h); records a librdkafka producer put on the wrong partition execute once, on their home
partition (4k)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.model.names import internal_topic
from streamsched.testing import (
    ROOT,
    WorkerProcess,
    make_event,
    produce_events,
    running_worker,
    wait_drained,
    wait_for,
)
from streamsched.wire.avro import AvroCodec
from streamsched.wire.claim import decode_claim, encode_claim
from streamsched.wire.dead_letter import view_dead_letter
from streamsched.wire.schedule import HISTORY_CODEC
from streamsched.worker.app import SchedulerDef

pytestmark = pytest.mark.kafka
HERE = Path(__file__).resolve().parent


def sched_name(unique: Callable[[str], str]) -> str:
    return unique("s").replace("-", "_")


async def final_states(bootstrap: str, sched: SchedulerDef) -> dict[str, ClaimState]:
    out: dict[str, ClaimState] = {}
    for rec in await read_topic(bootstrap, sched.state_topic):
        if rec.value is not None:
            try:
                st = decode_claim(rec.value)
            except Exception:  # noqa: BLE001 - the corrupt records a test seeded
                continue
            out[st.identity] = st
    return out


async def seed(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]) -> None:
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for key, value, partition in records:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def scheduler_topics(bootstrap: str, sched: SchedulerDef, partitions: int) -> None:
    await apply(bootstrap, [TopicSpec(sched.state_topic, partitions, 1, "state"),
                            TopicSpec(sched.dead_letter_topic, partitions, 1, "dead_letter"),
                            TopicSpec(sched.delay_topic, partitions, 1, "delay")])


# --- 4a -------------------------------------------------------------------------------------------


async def test_malformed_origin_is_dead_lettered_and_the_partition_moves_on(bootstrap: str, make_topic,
                                                                             unique,
        recording_scheduler) -> None:
    topic = await make_topic("o", partitions=1)
    rec = recording_scheduler(topic)
    sched, calls = rec.sched, rec.calls
    bad = dataclasses.replace(make_event("due", "t", ["bad"]), origin="sched:bad catalog!:job:1:1")
    raw = AvroCodec("transition").encode(bad.to_record())  # a foreign producer: no encode check
    good = [make_event("due", "t", [f"ok-{i}"]) for i in range(5)]
    await produce_events(bootstrap, topic, good[:2], raw=[(route_key("t", ("bad",)), raw)])
    await produce_events(bootstrap, topic, good[2:])
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
    assert len(calls) == 5  # every healthy item once; the malformed one never executed
    assert len({c.idempotency_key for c in calls}) == 5
    [dl] = [view_dead_letter(r) for r in await read_topic(bootstrap, sched.dead_letter_topic)]
    assert (dl.kind, dl.reason, dl.source_offset) == ("decode", "origin: malformed", 2)
    assert worker.metrics.counters.get("partition_restarts", 0) == 0


# --- 4b + 4h --------------------------------------------------------------------------------------


def _exhausted(identity: str, ordinal: int) -> bytes:
    """A claim left by ``ordinal`` deliveries that never resolved (lease long expired)."""
    return encode_claim(ClaimState(identity, ClaimStatus.CLAIMED, "crashed-owner", fence=ordinal,
                                   lease_expires_ns=1, ordinal=ordinal, revision=ordinal))


async def test_item_past_the_attempt_bound_fails_and_corrupt_state_is_exported(bootstrap: str, make_topic,
                                                                                unique,
        recording_scheduler) -> None:
    topic = await make_topic("x", partitions=1)
    rec = recording_scheduler(topic)
    sched, calls = rec.sched, rec.calls
    await scheduler_topics(bootstrap, sched, 1)
    doomed, fine = make_event("due", "t", ["doomed"]), make_event("due", "t", ["fine"])
    identity = sched.resolve_identity(doomed.due_ns, doomed.tenant, doomed.target)
    seeded = _exhausted(identity, MAX_DELIVERY_ATTEMPTS)
    junk = (b"junk", b"\x00not a claim", 0)
    await seed(bootstrap, sched.state_topic, [(identity.encode(), seeded, 0), junk])
    await produce_events(bootstrap, topic, [doomed, fine])
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
    assert [c.ordinal for c in calls] == [1]  # only "fine" ran
    st = (await final_states(bootstrap, sched))[identity]
    assert st.status is ClaimStatus.RELEASED and st.outcome is not None
    assert (st.outcome.kind, st.outcome.error_kind) == (OutcomeKind.FAILED, "attempts_exhausted")
    [dl] = [view_dead_letter(r) for r in await read_topic(bootstrap, sched.dead_letter_topic)]
    assert (dl.kind, dl.source_offset) == ("attempts_exhausted", 0)
    counters = worker.metrics.counters
    assert counters.get("attempts_exhausted") == 1
    assert [v for k, v in counters.items() if k.startswith("state_corrupt_records")] == [1]


async def test_crash_looping_item_is_dead_lettered_after_the_last_attempt(bootstrap: str, make_topic, unique,
                                                                          tmp_path: Path) -> None:
    """Its handler SIGKILLs the worker on every delivery; each restart redelivers it. Seeded at
    ordinal 8 so the loop is short: deliveries 9 and 10 crash, the next one dead-letters."""
    topic = await make_topic("c", partitions=1)
    name = sched_name(unique)
    ordinals = tmp_path / "ordinals"
    env = {"CRASHLOOP_TOPIC": topic, "CRASHLOOP_NAME": name, "CRASHLOOP_LOG": str(ordinals),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
           "STREAMSCHED_SESSION_TIMEOUT": "6s", "STREAMSCHED_HEARTBEAT": "0.5s"}
    app = App("probe")

    @external_command()
    async def explode(ctx: CommandContext) -> None:
        return None

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[explode],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        return None

    sched = app.schedulers[name]  # the same identities and topics as crashloop_app's scheduler
    await scheduler_topics(bootstrap, sched, 1)
    ev = make_event("due", "t", ["crash"])
    identity = sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)
    seeded = _exhausted(identity, MAX_DELIVERY_ATTEMPTS - 2)
    await seed(bootstrap, sched.state_topic, [(identity.encode(), seeded, 0)])
    await produce_events(bootstrap, topic, [ev])

    async def drained() -> bool:
        # The delay topic too: a successor parks the dead worker's claim there until it has
        # watched it for a whole claim duration, and only then delivers it again.
        return ((await group_lag(bootstrap, sched.group, topic)).total == 0
                and (await group_lag(bootstrap, sched.group, sched.delay_topic)).total == 0)

    kills = 0
    for _ in range(4):
        proc = WorkerProcess("crashloop_app:app", bootstrap, env=env, log_path=tmp_path / "w.log").start()
        try:
            async def settled(proc: WorkerProcess = proc) -> bool:
                return not proc.alive() or await drained()

            await wait_for(settled, timeout=90, interval=0.5, what="a crash or the item resolved")
        finally:
            code = proc.terminate() if proc.alive() else proc.wait(10)
        if code == -signal.SIGKILL:
            kills += 1
            continue
        assert code == 0, (tmp_path / "w.log").read_text()[-2000:]
        break
    assert kills == 2
    assert ordinals.read_text().split() == [str(MAX_DELIVERY_ATTEMPTS - 1), str(MAX_DELIVERY_ATTEMPTS)]
    st = (await final_states(bootstrap, sched))[identity]
    assert st.outcome is not None and st.outcome.error_kind == "attempts_exhausted"
    assert [view_dead_letter(r).kind for r in await read_topic(bootstrap, sched.dead_letter_topic)] == [
        "attempts_exhausted"]


# --- 4g -------------------------------------------------------------------------------------------


async def test_feedback_topics_are_looked_up_once(bootstrap: str, make_topic, unique,
                                                  monkeypatch: pytest.MonkeyPatch,
        recording_scheduler) -> None:
    topic = await make_topic("g", partitions=1)
    catalog = unique("cat")
    feedback = await make_topic(name=internal_topic("schedules", catalog, "feedback"), kind="output")
    rec = recording_scheduler(topic)
    sched, calls = rec.sched, rec.calls
    real_admin = clients.admin
    from_turn: list[str] = []

    def counting_admin(*args: Any, **kw: Any) -> Any:
        frames = {Path(f.filename).name for f in inspect.stack(0)}
        if frames & {"turn.py", "feedback.py"}:
            from_turn.append("admin")
        return real_admin(*args, **kw)

    monkeypatch.setattr(clients, "admin", counting_admin)

    def fired(i: int, cat: str) -> TransitionEvent:
        return dataclasses.replace(make_event("due", "t", [f"{cat}-{i}"]), origin=f"sched:{cat}:job:1:{i}")

    events = [fired(i, catalog) for i in range(10)] + [fired(i, unique("gone")[:12] + "x") for i in range(1)]
    missing = [fired(i, "nocatalog") for i in range(30)]
    await produce_events(bootstrap, topic, events + missing)
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
    assert len(calls) == 41
    # One lookup per feedback topic (3 topics), not one per item (41).
    assert len(from_turn) == 3, from_turn
    rows = [HISTORY_CODEC.decode(r.value) for r in await read_topic(bootstrap, feedback)]
    assert len(rows) == 10 and {r["state"] for r in rows} == {"SUCCEEDED"}
    assert worker.metrics.counters.get("feedback_dropped") == 31


# --- 4k -------------------------------------------------------------------------------------------


def produce_with_librdkafka(bootstrap: str, topic: str, events: list[TransitionEvent]) -> dict[bytes, int]:
    """Produce with confluent-kafka's default partitioner; the partition each key landed on."""
    from confluent_kafka import Producer

    landed: dict[bytes, int] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        landed[msg.key()] = msg.partition()

    from streamsched.wire.transition import encode_transition

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for ev in events:
        p.produce(topic, encode_transition(ev), key=route_key(ev.tenant, ev.target), on_delivery=report,
                  headers=[("trace", b"librdkafka")])
    assert p.flush(30) == 0
    return landed


async def test_both_partitioners_one_effect_per_identity(bootstrap: str, make_topic, unique,
        recording_scheduler) -> None:
    topic = await make_topic("k", partitions=8)
    rec = recording_scheduler(topic)
    sched, calls = rec.sched, rec.calls
    events = [make_event("due", f"tenant-{i % 3}", [f"item-{i}"], due_ns=i) for i in range(24)]
    await produce_events(bootstrap, topic, events)  # aiokafka: murmur2, the home partitions
    landed = await asyncio.to_thread(produce_with_librdkafka, bootstrap, topic, events)
    strays = {k for k, p in landed.items() if p != partition_for_key(k, 8)}
    assert len(strays) >= 5, "the two partitioners should disagree for most keys"
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=120)
    per_identity = collections.Counter(c.idempotency_key for c in calls)
    assert len(per_identity) == 24 and set(per_identity.values()) == {1}
    assert worker.metrics.counters.get("forwarded") == len(strays)
    # Every forwarded copy sits on its home partition, with its key, value and headers.
    records = await read_topic(bootstrap, topic)
    for rec in records:
        assert rec.partition in (partition_for_key(rec.key, 8), landed[rec.key])
    home_copies = collections.Counter(rec.key for rec in records
                                      if rec.partition == partition_for_key(rec.key, 8)
                                      and dict(rec.headers).get("trace") == b"librdkafka")
    assert home_copies == collections.Counter(landed.keys())  # forwarded strays + the ones that landed home
