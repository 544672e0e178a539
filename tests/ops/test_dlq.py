"""Dead letters on a real broker: a garbage stream never stalls a partition, nothing is lost,
listing and replay (dedup through stored outcomes), and redaction of every operator surface."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import business_identity, route_key
from streamsched.model.limits import MAX_DEAD_LETTER_BYTES
from streamsched.model.retry import Terminal
from streamsched.ops.dlq import format_dead_letters, list_dead_letters, replay, replay_group
from streamsched.testing import make_event, running_worker, wait_drained, wait_for
from streamsched.wire.avro import AvroCodec
from streamsched.wire.dead_letter import DeadLetterView
from streamsched.wire.transition import encode_transition
from streamsched.worker.app import SchedulerDef

pytestmark = [pytest.mark.kafka, pytest.mark.dlq]

DL_CODEC = AvroCodec("dead_letter")
Unique = Callable[[str], str]
TOPIC_MAX_BYTES = 2 * 1024 * 1024
OVERSIZE = 300 * 1024 + 17


# --- helpers ------------------------------------------------------------------------------------


running = running_worker


def poison_app(topic: str, name: str, calls: list[CommandContext], *, secret: str = "") -> SchedulerDef:
    """Runs ``record`` for every "due" event; targets starting with "poison" fail terminally."""
    app = App("dlq")

    @external_command()
    async def record(ctx: CommandContext, *, target: str) -> str:
        calls.append(ctx)
        return target

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[record],
                   claim_duration_s=10)
    async def handle(turn: Turn) -> None:
        if turn.event.target[0].startswith("poison"):
            raise Terminal(f"poisoned {turn.event.tenant} {secret}")
        await turn.commands.record(target=turn.event.target[0])

    return app.schedulers[name]


async def big_topic(bootstrap: str, name: str, partitions: int) -> str:
    """A transition topic that accepts records of up to 2 MiB (so oversize garbage can exist)."""
    await apply(bootstrap, [TopicSpec(name, partitions, 1, "transition",
                                      {"max.message.bytes": str(TOPIC_MAX_BYTES)})])
    return name


@dataclass
class Entry:
    label: str
    """"ok", "ignored", "poison" or "garbage:<what>"."""
    key: bytes | None
    value: bytes | None
    event: TransitionEvent | None = None
    partition: int = -1
    offset: int = -1

    @property
    def expected_kind(self) -> str | None:
        if self.label.startswith("garbage"):
            return "decode"
        return "terminal" if self.label == "poison" else None


def event_entry(label: str, ev: TransitionEvent) -> Entry:
    return Entry(label, route_key(ev.tenant, ev.target), encode_transition(ev), ev)


async def send_in_order(bootstrap: str, topic: str, entries: list[Entry]) -> None:
    """Produce ``entries`` in list order (idempotent producer: per-partition order is kept) and
    record where each landed."""
    producer = clients.producer(bootstrap, linger_ms=5, max_request_size=TOPIC_MAX_BYTES)
    await producer.start()
    try:
        futures = [await producer.send(topic, e.value, key=e.key) for e in entries]
        for e, md in zip(entries, await asyncio.gather(*futures), strict=True):
            e.partition, e.offset = md.partition, md.offset
    finally:
        await producer.stop()


def garbage(rng: random.Random, *, secret: str = "", oversize: int = 2) -> list[Entry]:
    """~20 undecodable records of every flavour (each optionally carrying ``secret``)."""
    mark = secret.encode()

    def key() -> bytes | None:
        return None if rng.random() < 0.3 else rng.randbytes(rng.randint(1, 24)) + mark

    def valid(i: int) -> bytes:
        return encode_transition(make_event("due", f"tenant-{secret}-{i}", [f"g{i}", secret or "x"],
                                            payload={"secret": secret, "i": i}))

    out: list[Entry] = []
    for _ in range(4):
        out.append(Entry("garbage:random", key(), rng.randbytes(rng.randint(1, 300)) + mark))
    for i in range(4):
        enc = valid(i)
        out.append(Entry("garbage:truncated", key(), enc[: rng.randint(2, len(enc) - 1)]))
    for _ in range(3):
        out.append(Entry("garbage:none", mark + b"-none" if secret else b"none-key", None))
    for i in range(3):
        out.append(Entry("garbage:magic", key(), bytes([rng.choice([0x00, 0xA4, 0xFF])]) + valid(10 + i)[1:]))
    for i in range(2):
        out.append(Entry("garbage:schema", key(), bytes((0xA5, 2)) + valid(20 + i)[2:]))
    out.append(Entry("garbage:empty", key(), b""))
    for i in range(oversize):
        filler = (mark * (OVERSIZE // max(1, len(mark)) + 1))[:OVERSIZE] if mark else rng.randbytes(OVERSIZE)
        out.append(Entry("garbage:oversize", key(), valid(30 + i)[:2] + filler))
    return out


def tail_events(partitions: int, tag: str) -> list[TransitionEvent]:
    """Healthy "due" events, at least one routed to every partition (default partitioner)."""
    from aiokafka.partitioner import murmur2

    out: list[TransitionEvent] = []
    covered: set[int] = set()
    i = 0
    while len(covered) < partitions:
        ev = make_event("due", "tail", [f"{tag}-{i}"], due_ns=i)
        covered.add((murmur2(route_key(ev.tenant, ev.target)) & 0x7FFFFFFF) % partitions)
        out.append(ev)
        i += 1
    return out


def identity(sched: SchedulerDef, ev: TransitionEvent) -> str:
    return business_identity(sched.identity_parts(ev))


def headers_of(rec: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in rec.headers}


async def dead_letters(bootstrap: str, sched: SchedulerDef) -> list[Any]:
    return await read_topic(bootstrap, sched.dead_letter_topic, timeout_s=60)


async def wait_dead_letters(bootstrap: str, sched: SchedulerDef, n: int, timeout: float = 120) -> None:
    async def enough() -> bool:
        return len(await dead_letters(bootstrap, sched)) >= n

    await wait_for(enough, timeout=timeout, interval=0.5, what=f"{n} dead letters")


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return (await group_lag(bootstrap, f"probe-{os.urandom(4).hex()}", topic)).end


def sched_name(unique: Unique) -> str:
    return unique("dlq").replace("-", "_")


def mixed_stream(rng: random.Random, *, ok: int, ignored: int, poison: int, secret: str = "",
                 oversize: int = 2) -> list[Entry]:
    tenant = f"tenant-{secret}" if secret else "acme"
    entries = [event_entry("ok", make_event("due", f"{tenant}-{i % 7}", [f"ok-{i}"], due_ns=i,
                                            payload={"i": i, "secret": secret})) for i in range(ok)]
    entries += [event_entry("ignored", make_event("other", tenant, [f"x-{i}"])) for i in range(ignored)]
    entries += [event_entry("poison", make_event("due", tenant, [f"poison-{i}", secret or "p"], due_ns=i,
                                                 payload={"secret": secret})) for i in range(poison)]
    entries += garbage(rng, secret=secret, oversize=oversize)
    rng.shuffle(entries)
    return entries


# --- 1. a garbage stream ------------------------------------------------------------------------


async def test_garbage_stream_never_stalls_and_loses_nothing(bootstrap: str, unique: Unique) -> None:
    topic = await big_topic(bootstrap, unique("garbage"), 4)
    rng = random.Random(20240611)
    calls: list[CommandContext] = []
    sched = poison_app(topic, sched_name(unique), calls)
    entries = mixed_stream(rng, ok=178, ignored=10, poison=12)
    bad = [e for e in entries if e.expected_kind is not None]
    assert 0.08 <= sum(e.label.startswith("garbage") for e in entries) / len(entries) <= 0.12
    await send_in_order(bootstrap, topic, entries)

    async with running(sched, bootstrap) as worker:
        await asyncio.wait_for(worker.assigned.wait(), 60)
        # Every bad record is processed (dead-lettered) first ...
        await wait_dead_letters(bootstrap, sched, len(bad))
        # ... then healthy events produced afterwards, to every partition, still get through.
        tail = [event_entry("ok", ev) for ev in tail_events(4, "tail")]
        await send_in_order(bootstrap, topic, tail)
        await wait_drained(bootstrap, sched.group, topic, timeout=120)
        counters = dict(worker.metrics.counters)

    everything = entries + tail
    healthy = [e for e in everything if e.label == "ok"]
    # Every healthy item executed exactly once.
    executed = Counter(c.idempotency_key for c in calls)
    assert executed == Counter(identity(sched, e.event) for e in healthy if e.event is not None)
    assert set(executed.values()) == {1}

    # Every bad record is in the DLQ exactly once, with the right kind.
    dead = await dead_letters(bootstrap, sched)
    got = sorted((int(headers_of(r)["ss-source-partition"]), int(headers_of(r)["ss-source-offset"]),
                  headers_of(r)["ss-kind"]) for r in dead)
    assert got == sorted((e.partition, e.offset, e.expected_kind) for e in bad)
    by_pos = {(e.partition, e.offset): e for e in bad}
    for r in dead:
        h = headers_of(r)
        d = DL_CODEC.decode(r.value)
        e = by_pos[(d["source_partition"], d["source_offset"])]
        assert d["kind"] == h["ss-kind"] and h["ss-source-topic"] == d["source_topic"] == topic
        assert h["ss-reason"] == d["reason"] and h["ss-attempt"] == str(d["attempt"]) == "1"
        assert r.partition == e.partition  # co-partitioned with the source
        assert d["original"] == (e.value or b"") and d["original_key"] == e.key
        expected_reason = {"garbage:none": "record has no value", "garbage:oversize": "oversize",
                           "garbage:magic": "bad magic", "garbage:schema": "schema mismatch",
                           "garbage:empty": "truncated", "poison": "handler_terminal"}.get(e.label)
        if expected_reason is not None:
            assert d["reason"] == expected_reason, e.label

    # Nothing lost: every record is executed, dead-lettered or ignored (not selected).
    ignored = [e for e in everything if e.label == "ignored"]
    assert len(everything) == len(calls) + len(dead) + len(ignored)
    assert counters.get("records") == counters.get("committed") == len(everything)
    assert counters.get("dead_lettered") == len(bad)
    assert "partition_restarts" not in counters and "fenced" not in counters

    # No partition stalled: each ends with a healthy tail event produced after its garbage was
    # processed, and that event executed (checked above) and is committed.
    lag = await group_lag(bootstrap, sched.group, topic)
    assert lag.total == 0
    for p in range(4):
        last_bad = max((e.offset for e in bad if e.partition == p), default=-1)
        tails = [e.offset for e in tail if e.partition == p]
        assert tails and min(tails) > last_bad
        assert lag.committed[p] == lag.end[p] == max(e.offset for e in everything if e.partition == p) + 1


# --- 2. list and replay -------------------------------------------------------------------------


async def test_list_and_replay_terminal_dead_letters(bootstrap: str, unique: Unique) -> None:

    topic = await big_topic(bootstrap, unique("replay"), 2)
    rng = random.Random(7)
    calls: list[CommandContext] = []
    sched = poison_app(topic, sched_name(unique), calls)
    entries = [event_entry("ok", make_event("due", "acme", [f"ok-{i}"], due_ns=i)) for i in range(20)]
    entries += [event_entry("poison", make_event("due", "acme", [f"poison-{i}"])) for i in range(5)]
    junk = [e for e in garbage(rng, oversize=0) if e.label in ("garbage:random", "garbage:none")][:4]
    entries += junk
    rng.shuffle(entries)
    await send_in_order(bootstrap, topic, entries)
    poison = [e for e in entries if e.label == "poison"]
    dlq = sched.dead_letter_topic

    async with running(sched, bootstrap) as worker:
        await asyncio.wait_for(worker.assigned.wait(), 60)
        await wait_drained(bootstrap, sched.group, topic, timeout=120)
        await wait_dead_letters(bootstrap, sched, 9)
        assert len(calls) == 20
        # One record in the DLQ that is not a DeadLetter at all.
        producer = clients.producer(bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(dlq, b"\xa5\x07not a dead letter", partition=0)
        finally:
            await producer.stop()

        views = await list_dead_letters(bootstrap, dlq)
        assert len(views) == 10
        assert Counter(v.kind for v in views) == {"terminal": 5, "decode": 4, "corrupt": 1}
        positions = {(e.partition, e.offset): e for e in entries}
        for v in views:
            assert "original" not in repr(v) and str(v) == repr(v)
            if v.kind == "corrupt":
                assert v.partition == 0 and v.reason == "truncated" and v.source_offset == -1
                continue
            e = positions[(v.source_partition, v.source_offset)]
            assert v.source_topic == topic and v.partition == e.partition and v.attempt == 1
            assert v.at_ns > 0 and v.original == (e.value or b"") and v.original_key == e.key
            assert v.kind == e.expected_kind
            if v.kind == "terminal":
                assert v.reason == "handler_terminal"
        assert [v.kind for v in await list_dead_letters(bootstrap, dlq, kind="terminal")] == ["terminal"] * 5
        assert len(await list_dead_letters(bootstrap, dlq, limit=3)) == 3
        table = format_dead_letters(views)
        assert len(table.splitlines()) == 1 + 10 + 1 and "handler_terminal" in table

        executed_before = len(calls)
        skipped_before = worker.metrics.counters.get("skipped_outcome", 0)
        source_end = await end_offsets(bootstrap, topic)
        dlq_before = len(await dead_letters(bootstrap, sched))

        dry = await replay(bootstrap, dlq, kinds={"terminal"}, dry_run=True)
        assert (dry.dry_run, dry.replayed, dry.by_source_topic) == (True, 5, {topic: 5})
        assert dry.skipped == {"decode": 4, "corrupt": 1}
        # A replay has sent everything it produces when it returns (a dry run has no producer at
        # all), so there is nothing to wait for before looking.
        assert await end_offsets(bootstrap, topic) == source_end  # nothing produced
        admin = clients.admin(bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(replay_group(dlq))
        finally:
            await admin.close()
        assert all(om.offset < 0 for om in offsets.values())  # nothing committed

        done = await replay(bootstrap, dlq, kinds={"terminal"})
        assert (done.dry_run, done.replayed, done.by_source_topic) == (False, 5, {topic: 5})
        assert done.skipped == {"decode": 4, "corrupt": 1} and not done.limited
        after = await end_offsets(bootstrap, topic)
        assert sum(after.values()) == sum(source_end.values()) + 5

        async def skipped_all() -> bool:
            return worker.metrics.counters.get("skipped_outcome", 0) >= skipped_before + 5

        await wait_for(skipped_all, timeout=60, what="replayed terminal letters to be skipped")
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
        assert len(calls) == executed_before  # outcome FAILED is stored: not executed again
        assert worker.metrics.counters.get("skipped_outcome", 0) == skipped_before + 5
        assert len(await dead_letters(bootstrap, sched)) == dlq_before  # not dead-lettered again

        again = await replay(bootstrap, dlq, kinds={"terminal"})
        assert again.replayed == 0 and again.skipped == {"decode": 4, "corrupt": 1}
        # Terminal letters behind a pending decode letter are rescanned, known as replayed.
        assert 0 <= again.already_replayed <= 5
        # The pass over "terminal" did not consume the pending decode letters.
        later = await replay(bootstrap, dlq, kinds={"decode"}, dry_run=True)
        assert later.replayed == 4 and later.skipped == {"corrupt": 1}

    # The replayed records are the originals, byte for byte, on their original partitions.
    replayed = [r for r in await read_topic(bootstrap, topic) if r.offset >= source_end[r.partition]]
    assert sorted((r.partition, r.key, r.value) for r in replayed) == sorted(
        (e.partition, e.key, e.value) for e in poison)


# --- 3. redaction -------------------------------------------------------------------------------

SECRET = "s3cr3t-Marker-7f41a9"


async def test_no_secret_reaches_any_dead_letter_surface(bootstrap: str, unique: Unique) -> None:
    topic = await big_topic(bootstrap, unique("redact"), 2)
    rng = random.Random(99)
    calls: list[CommandContext] = []
    sched = poison_app(topic, sched_name(unique), calls, secret=SECRET)
    entries = mixed_stream(rng, ok=20, ignored=2, poison=6, secret=SECRET, oversize=1)
    bad = [e for e in entries if e.expected_kind is not None]
    await send_in_order(bootstrap, topic, entries)

    async with running(sched, bootstrap) as worker:
        await asyncio.wait_for(worker.assigned.wait(), 60)
        await wait_drained(bootstrap, sched.group, topic, timeout=120)
        await wait_dead_letters(bootstrap, sched, len(bad))
        snapshot = json.dumps(worker.metrics.snapshot())
    secret = SECRET.encode()
    assert SECRET not in snapshot

    dead = await dead_letters(bootstrap, sched)
    assert len(dead) == len(bad)
    carried = 0
    for r in dead:
        assert not any(secret in k.encode() or secret in v for k, v in r.headers)
        d = DL_CODEC.decode(r.value)
        assert SECRET not in d["reason"] and SECRET not in d["kind"]
        carried += secret in d["original"] or secret in (d["original_key"] or b"")
    # The originals are preserved (so the checks above mean something).
    assert carried == sum(secret in (e.value or b"") or secret in (e.key or b"") for e in bad) > len(bad) / 2

    views: list[DeadLetterView] = await list_dead_letters(bootstrap, sched.dead_letter_topic, limit=1000)
    assert len(views) == len(bad)
    for v in views:
        assert SECRET not in repr(v) and SECRET not in str(v) and SECRET not in v.reason
    assert SECRET not in format_dead_letters(views)
    report = await replay(bootstrap, sched.dead_letter_topic, dry_run=True)
    assert report.replayed == len(bad) and SECRET not in json.dumps(report.to_dict())


# --- 4. a record too large for a DeadLetter -----------------------------------------------------


async def test_record_larger_than_dead_letter_bound_is_dead_lettered(bootstrap: str, unique: Unique) -> None:
    from streamsched.model.claims import ClaimState
    from streamsched.wire.claim import CLAIM_CODEC

    topic = await big_topic(bootstrap, unique("huge"), 1)
    calls: list[CommandContext] = []
    sched = poison_app(topic, sched_name(unique), calls)
    before = event_entry("ok", make_event("due", "acme", ["before"]))
    huge = Entry("garbage:huge", b"k", b"\xa5\x01" + os.urandom(MAX_DEAD_LETTER_BYTES + 1024))
    after = event_entry("ok", make_event("due", "acme", ["after"]))
    await send_in_order(bootstrap, topic, [before, huge])
    async with running(sched, bootstrap) as worker:
        await asyncio.wait_for(worker.assigned.wait(), 60)
        with contextlib.suppress(TimeoutError):
            await wait_dead_letters(bootstrap, sched, 1, timeout=15)
        await send_in_order(bootstrap, topic, [after])
        await wait_drained(bootstrap, sched.group, topic, timeout=45)
    assert [headers_of(r)["ss-kind"] for r in await dead_letters(bootstrap, sched)] == ["decode"]
    assert Counter(c.idempotency_key for c in calls) == Counter(
        identity(sched, e.event) for e in (before, after) if e.event is not None)
    latest = {}
    for rec in await read_topic(bootstrap, sched.state_topic):
        if rec.value is None:
            continue  # a tombstone: each owner's read barrier
        st = ClaimState.from_record(CLAIM_CODEC.decode(rec.value))
        latest[st.identity] = st
    assert all(st.outcome is not None for st in latest.values())
