"""Records compressed by another producer: Kafka's own Java producer with gzip, snappy, lz4 and
zstd, consumed by a real worker. Every codec decodes (aiokafka[lz4,snappy,zstd]); a batch that
still cannot be decompressed stops only its partition, at that offset, named in status."""

from __future__ import annotations

from pathlib import Path

import pytest
from java_support import requires, run_java

from streamsched.kafka.codecs import CODECS, UndecodableBatch, available, missing_codec
from streamsched.kafka.producer import encode_event
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.event import TransitionEvent
from streamsched.ops.broker import ensure_jars
from streamsched.ops.status import redact_snapshot
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for

HERE = Path(__file__).resolve().parent
needs_java = requires("java")


def test_this_process_decodes_every_codec() -> None:
    assert available() == dict.fromkeys(CODECS, True)


def test_undecodable_batch_names_the_missing_codec() -> None:
    from aiokafka.errors import CorruptRecordException, UnsupportedCodecError

    missing = UnsupportedCodecError("Libraries for zstd compression codec not found")
    err = UndecodableBatch("orders", 3, 17, missing)
    assert (err.reason, err.codec, err.kind) == ("zstd", "zstd", "missing_codec")
    assert "\n" not in str(err) and "orders[3]" in str(err) and "offset 17" in str(err) and "zstd" in str(err)
    unknown = UndecodableBatch("orders", 0, None, UnsupportedCodecError("Unknown compression codec 0x05"))
    assert (unknown.reason, unknown.codec, unknown.kind) == ("unknown_codec", None, "unknown_codec")
    corrupt = UndecodableBatch("orders", 0, 4, CorruptRecordException("Invalid CRC"))
    assert (corrupt.reason, corrupt.kind) == ("corrupt", "corrupt_batch")
    assert missing_codec(ValueError("x")) is None


def java_produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    """Produce ``CODEC PARTITION KEY_HEX VALUE_HEX`` lines with Kafka's Java client."""
    cp = f"{ensure_jars()}/*"  # the broker's own classpath: kafka-clients, lz4, snappy, zstd
    proc = run_java(HERE / "CodecProducer.java", cp, [bootstrap, topic], stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0 and proc.stdout.strip() == f"produced {len(lines)}", proc.stderr[-3000:]


def line(codec: str, event: TransitionEvent, partitions: int) -> tuple[str, int]:
    key, value = encode_event(event)
    p = partition_for_key(key, partitions)
    return f"{codec} {p} {key.hex()} {value.hex()}", p


def homed(partition: int, partitions: int, count: int, tenant: str) -> list[TransitionEvent]:
    """``count`` valid events whose home partition is ``partition``."""
    out: list[TransitionEvent] = []
    i = 0
    while len(out) < count:
        ev = make_event("due", tenant, [f"run-{i}"])
        i += 1
        if partition_for_key(encode_event(ev)[0], partitions) == partition:
            out.append(ev)
    return out


@needs_java
async def test_java_producer_every_codec_handled_exactly_once(bootstrap: str, make_topic,
                                                              recording_scheduler) -> None:
    partitions = 4
    topic = await make_topic("codecs", partitions=partitions)
    by_codec = {codec: [make_event("due", f"t-{codec}", [f"run-{i}"]) for i in range(6)] for codec in CODECS}
    lines = [line(codec, ev, partitions)[0] for codec, evs in by_codec.items() for ev in evs]
    java_produce(bootstrap, topic, lines)

    rec = recording_scheduler(topic, prefix="codecs")
    async with running_worker(rec.sched, bootstrap) as worker:
        await wait_drained(bootstrap, rec.sched.group, topic, timeout=90)
        assert not worker.fetch.stopped and worker.metrics.last_error is None  # while it owns them
    per_identity = rec.per_identity()
    for codec, evs in by_codec.items():
        ids = rec.identities(evs)
        assert {i: per_identity[i] for i in ids} == dict.fromkeys(ids, 1), codec
    assert sum(per_identity.values()) == sum(len(evs) for evs in by_codec.values())
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []


@needs_java
async def test_missing_codec_stops_only_its_partition_at_that_offset(
        bootstrap: str, make_topic, recording_scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    import aiokafka.codec

    partitions = 2
    topic = await make_topic("nolz4", partitions=partitions)
    plain0 = homed(0, partitions, 3, "plain0")
    lz4 = homed(0, partitions, 4, "lz4")
    plain1 = homed(1, partitions, 4, "plain1")
    # Partition 0: three uncompressed records (offsets 0-2), then an lz4 batch from offset 3.
    java_produce(bootstrap, topic, [line("none", ev, partitions)[0] for ev in plain0 + plain1]
                 + [line("lz4", ev, partitions)[0] for ev in lz4])

    rec = recording_scheduler(topic, prefix="nolz4")
    sched, calls = rec.sched, rec.calls
    from aiokafka import TopicPartition

    stuck = TopicPartition(topic, 0)
    monkeypatch.setattr(aiokafka.codec, "has_lz4", lambda: False)  # this process "lacks" lz4
    async with running_worker(sched, bootstrap) as worker:
        async def stopped() -> bool:
            return stuck in worker.fetch.stopped and len(calls) >= len(plain0) + len(plain1)

        await wait_for(stopped, timeout=60, what="partition 0 to stop at the lz4 batch")
        done = {c.idempotency_key for c in calls}
        # Everything decodable ran, partition 0's records ahead of the batch too; nothing of it.
        assert done == rec.identities(plain0 + plain1)
        err = worker.fetch.stopped[stuck]
        assert (err.codec, err.offset) == ("lz4", 3) and "lz4" in str(err) and "\n" not in str(err)
        status = redact_snapshot(worker.metrics.snapshot())  # what /status serves
        assert status["last_error"]["kind"] == "missing_codec"
        assert status["last_error"]["type"] == "UndecodableBatch"
        assert status["gauges"]["partition_stopped{kind=transition,partition=0,reason=lz4}"] == 1
        assert status["gauges"]["partition_stopped_offset{kind=transition,partition=0}"] == 3
        assert worker.ready is False

        # The other partition goes on: new events on partition 1 run while partition 0 stays put.
        later = homed(1, partitions, 3, "later1")
        await produce_events(bootstrap, topic, later)

        async def later_ran() -> bool:
            return rec.identities(later) <= {c.idempotency_key for c in calls}

        await wait_for(later_ran, timeout=60, what="partition 1 to go on")
        assert stuck in worker.fetch.stopped
        assert not rec.identities(lz4) & {c.idempotency_key for c in calls}

    # With the codec back, a new worker resumes partition 0 at the lz4 batch: each event once.
    monkeypatch.undo()
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
        assert not worker.fetch.stopped
    assert rec.per_identity() == dict.fromkeys(rec.identities(plain0 + plain1 + lz4 + later), 1)
    assert await read_topic(bootstrap, sched.dead_letter_topic) == []
