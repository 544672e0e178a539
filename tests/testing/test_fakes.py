"""The in-memory Kafka (streamsched.testing.fakes): the transactional semantics unit tests rely on.

These pin the fake to what a broker does (invisibility until commit, abort, fencing, offsets,
markers taking offsets); the same facts are proven against a real broker in tests/crash and
tests/worker, so a divergence here would make the broker-free tests lie.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, ProducerFenced

from streamsched.kafka.writer import GroupedWriter, partition_for_key
from streamsched.testing.fakes import FakeKafka, FakeProducer, Isolation, ProducerOp, TopicPartition


async def started(kafka: FakeKafka, tid: str | None = "tx-1", **kw: int) -> FakeProducer:
    p = kafka.producer(tid, **kw)
    await p.start()
    return p


def values(kafka: FakeKafka, topic: str, isolation: Isolation = "read_committed") -> list[bytes | None]:
    return [r.value for r in kafka.records(topic, isolation=isolation)]


async def test_transaction_invisible_until_commit_and_markers_take_offsets() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    p = await started(kafka)
    await p.begin_transaction()
    await p.send_and_wait("t", b"a", partition=0)
    batch = p.create_batch()
    assert batch.append(timestamp=None, key=b"k", value=b"b", headers=[("h", b"1")]) is not None
    await (await p.send_batch(batch, "t", partition=0))
    assert values(kafka, "t") == []
    assert values(kafka, "t", "read_uncommitted") == [b"a", b"b"]
    assert kafka.last_stable_offset("t", 0) == 0
    await p.commit_transaction()
    recs = kafka.records("t")
    assert [(r.offset, r.key, r.value, r.headers) for r in recs] == [
        (0, None, b"a", ()), (1, b"k", b"b", (("h", b"1"),))]
    # The COMMIT marker takes offset 2: the end is 3, and a consumer's position moves past it.
    assert kafka.end_offset("t", 0) == kafka.last_stable_offset("t", 0) == 3
    c = kafka.consumer("g")
    c.assign([TopicPartition("t", 0)])
    got = await c.getmany(timeout_ms=0)
    assert [r.value for r in got[TopicPartition("t", 0)]] == [b"a", b"b"]
    assert await c.position(TopicPartition("t", 0)) == 3


async def test_open_transaction_holds_back_later_plain_records() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    p = await started(kafka)
    await p.begin_transaction()
    await p.send("t", b"txn", partition=0)
    kafka.produce("t", b"plain", partition=0)
    # read_committed stops at the last stable offset: the plain record waits for the transaction.
    assert values(kafka, "t") == []
    await p.commit_transaction()
    assert values(kafka, "t") == [b"txn", b"plain"]


async def test_abort_discards_records_and_offsets() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    kafka.create_topic("src")
    p = await started(kafka)
    await p.begin_transaction()
    await p.send("t", b"x", partition=0)
    await p.send_offsets_to_transaction({KafkaTopicPartition("src", 0): 7}, "g")
    await p.abort_transaction()
    assert values(kafka, "t") == []
    assert values(kafka, "t", "read_uncommitted") == [b"x"]
    assert kafka.committed("g", "src", 0) is None
    c = kafka.consumer()
    c.assign([TopicPartition("t", 0)])
    assert await c.getmany() == {}
    assert await c.position(TopicPartition("t", 0)) == 2  # past the aborted record and its marker
    # The producer is usable again after an abort.
    await p.begin_transaction()
    await p.send("t", b"y", partition=0)
    await p.commit_transaction()
    assert values(kafka, "t") == [b"y"]


async def test_offsets_commit_with_the_transaction_and_the_last_one_wins() -> None:
    kafka = FakeKafka()
    kafka.create_topic("src", 2)
    p = await started(kafka)
    await p.begin_transaction()
    await p.send_offsets_to_transaction({KafkaTopicPartition("src", 0): 3}, "g")
    await p.send_offsets_to_transaction({KafkaTopicPartition("src", 0): 5,
                                         KafkaTopicPartition("src", 1): 1}, "g")
    assert kafka.committed("g", "src", 0) is None
    await p.commit_transaction()
    assert (kafka.committed("g", "src", 0), kafka.committed("g", "src", 1)) == (5, 1)
    assert kafka.committed("other", "src", 0) is None
    c = kafka.consumer("g")
    c.assign([KafkaTopicPartition("src", 0)])
    assert await c.committed(KafkaTopicPartition("src", 0)) == 5
    assert await c.position(KafkaTopicPartition("src", 0)) == 5  # resumes from the committed offset


async def test_new_producer_with_the_same_id_fences_the_old_one() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    old = await started(kafka, "tx")
    await old.begin_transaction()
    await old.send("t", b"zombie", partition=0)
    await old.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
    new = await started(kafka, "tx")
    # InitProducerId aborted the old incarnation's open transaction: nothing of it survives.
    assert not kafka.in_transaction("tx")
    assert values(kafka, "t") == [] and kafka.committed("g", "t", 0) is None
    with pytest.raises(ProducerFenced):
        await old.send("t", b"late", partition=0)
    with pytest.raises(ProducerFenced):
        await old.commit_transaction()
    with pytest.raises(ProducerFenced):
        await old.begin_transaction()
    await new.begin_transaction()
    await new.send("t", b"owner", partition=0)
    await new.commit_transaction()
    assert values(kafka, "t") == [b"owner"]


@pytest.mark.parametrize("op", ["send_batch", "send_offsets_to_transaction", "commit_transaction"])
async def test_fenced_mid_transaction_every_later_write_raises(op: ProducerOp) -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    p = await started(kafka, "tx")
    p.before(op, lambda: kafka.fence("tx"))
    await p.begin_transaction()
    await p.send("t", b"before", partition=0)
    with pytest.raises(ProducerFenced):
        batch = p.create_batch()
        batch.append(timestamp=None, key=None, value=b"v")
        await p.send_batch(batch, "t", partition=0)
        await p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
        await p.commit_transaction()
    assert p.fenced
    with pytest.raises(ProducerFenced):
        await p.abort_transaction()
    assert values(kafka, "t") == [] and kafka.committed("g", "t", 0) is None
    assert kafka.last_stable_offset("t", 0) == kafka.end_offset("t", 0)  # nothing left open


async def test_injected_commit_failure_leaves_the_transaction_abortable() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    p = await started(kafka)
    p.fail("commit_transaction", KafkaError("injected"))
    await p.begin_transaction()
    await p.send("t", b"x", partition=0)
    with pytest.raises(KafkaError, match="injected"):
        await p.commit_transaction()
    assert kafka.in_transaction("tx-1") and values(kafka, "t") == []
    await p.abort_transaction()
    assert values(kafka, "t") == [] and not kafka.in_transaction("tx-1")
    assert p.calls == ["begin_transaction", "send", "commit_transaction", "abort_transaction"]


async def test_an_injected_hang_waits_until_cancelled_and_has_no_effect() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    p = await started(kafka)
    p.hang("commit_transaction")
    await p.begin_transaction()
    await p.send("t", b"x", partition=0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(p.commit_transaction(), 0.1)
    assert kafka.in_transaction("tx-1") and values(kafka, "t") == []
    await p.commit_transaction()  # once only
    assert values(kafka, "t") == [b"x"]


async def test_misuse_raises_like_aiokafka() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    unstarted = kafka.producer("tx")
    with pytest.raises(IllegalOperation):
        await unstarted.begin_transaction()
    p = await started(kafka)
    with pytest.raises(IllegalOperation):
        await p.send("t", b"x", partition=0)  # a transactional producer writes only in a transaction
    with pytest.raises(IllegalOperation):
        await p.commit_transaction()
    with pytest.raises(IllegalOperation):
        await p.send_offsets_to_transaction({TopicPartition("t", 0): 1}, "g")
    await p.begin_transaction()
    with pytest.raises(IllegalOperation):
        await p.begin_transaction()
    with pytest.raises(KafkaError):
        await p.send("nope", b"x")  # an unknown topic is never auto-created
    assert not kafka.in_transaction("tx-1")  # the coordinator learns of a transaction on its first write
    await p.send("t", b"open", partition=0)
    await p.stop()
    with pytest.raises(IllegalOperation):
        await p.send("t", b"x", partition=0)
    # A stopped process's open transaction stays open (blocking readers) until its id is fenced.
    assert kafka.in_transaction("tx-1")
    kafka.fence("tx-1")
    assert not kafka.in_transaction("tx-1")


async def test_grouped_writer_batches_split_and_keys_use_murmur2() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t", 4)
    p = await started(kafka, max_batch_size=200)
    w = GroupedWriter(p)
    keys = [f"k{i}".encode() for i in range(20)]
    for k in keys:
        w.add("t", b"v" * 40, key=k)
    w.add("t", b"pinned", partition=3)
    await p.begin_transaction()
    await w.flush()
    assert values(kafka, "t") == []
    await p.commit_transaction()
    recs = kafka.records("t")
    assert len(recs) == 21
    for r in recs:
        if r.key is not None:
            assert r.partition == partition_for_key(r.key, 4)
    assert [r.partition for r in recs if r.value == b"pinned"] == [3]
    assert p.calls.count("send_batch") > 4  # 200-byte batches: more than one per partition


async def test_getmany_waits_for_a_commit_and_respects_max_records() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    tp = TopicPartition("t", 0)
    c = kafka.consumer()
    c.assign([tp])
    assert await c.getmany(timeout_ms=10) == {}
    p = await started(kafka)
    await p.begin_transaction()
    await p.send("t", b"a", partition=0)
    await p.send("t", b"b", partition=0)

    async def commit_soon() -> None:
        await asyncio.sleep(0.01)
        await p.commit_transaction()

    task = asyncio.create_task(commit_soon())
    got = await c.getmany(timeout_ms=5_000, max_records=1)
    await task
    assert [r.value for r in got[tp]] == [b"a"]
    assert await c.position(tp) == 1
    got = await c.getmany(max_records=5)
    assert [r.value for r in got[tp]] == [b"b"]
    assert await c.position(tp) == 3  # the trailing COMMIT marker is stepped over
    # Results are keyed so that aiokafka's TopicPartition finds them.
    kafka.produce("t", b"c", partition=0)
    got = await c.getmany()
    assert [r.value for r in got[KafkaTopicPartition("t", 0)]] == [b"c"]


async def test_consumer_seek_commit_and_end_offsets() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    tp = TopicPartition("t", 0)
    for v in (b"0", b"1", b"2"):
        kafka.produce("t", v, partition=0)
    c = kafka.consumer("g")
    c.assign([tp])
    assert await c.committed(tp) is None
    c.seek(tp, 1)
    assert [r.value for r in (await c.getmany())[tp]] == [b"1", b"2"]
    await c.commit()
    assert kafka.committed("g", "t", 0) == 3
    await c.seek_to_beginning(tp)
    assert await c.position(tp) == 0
    p = await started(kafka)
    await p.begin_transaction()
    await p.send("t", b"open", partition=0)
    assert await c.end_offsets([tp]) == {tp: 3}  # read_committed: the last stable offset
    await c.seek_to_end(tp)
    assert await c.position(tp) == 3
    c.pause(tp)
    await p.commit_transaction()
    assert await c.getmany() == {}
    c.resume(tp)
    assert [r.value for r in (await c.getmany())[tp]] == [b"open"]


async def test_a_zombie_that_does_not_know_it_is_fenced_cannot_disturb_the_new_owner() -> None:
    kafka = FakeKafka()
    kafka.create_topic("t")
    old = await started(kafka, "tx")
    new = await started(kafka, "tx")
    await new.begin_transaction()
    await new.send("t", b"owner", partition=0)
    await old.begin_transaction()  # local in aiokafka: succeeds until the first broker call
    with pytest.raises(ProducerFenced):
        await old.send("t", b"zombie", partition=0)
    with pytest.raises(ProducerFenced):
        await old.abort_transaction()
    assert kafka.in_transaction("tx") and [r.value for r in kafka.open_records("tx")] == [b"owner"]
    await new.commit_transaction()
    assert values(kafka, "t") == [b"owner"]


async def test_transactions_history_records_what_was_written_together() -> None:
    kafka = FakeKafka()
    kafka.create_topic("a")
    kafka.create_topic("b")
    p = await started(kafka)
    async with p.transaction():
        await p.send("a", b"1", partition=0)
        await p.send("b", b"2", partition=0)
        await p.send_offsets_to_transaction({TopicPartition("a", 0): 1}, "g")
    with pytest.raises(RuntimeError):
        async with p.transaction():
            await p.send("a", b"3", partition=0)
            raise RuntimeError("handler failed")
    ok, aborted = kafka.transactions
    assert ok.committed
    assert [r.value for r in ok.on("a")] == [b"1"] and [r.value for r in ok.on("b")] == [b"2"]
    assert ok.offsets == {"g": {TopicPartition("a", 0): 1}}
    assert not aborted.committed and [r.value for r in aborted.records] == [b"3"]
    assert values(kafka, "a") == [b"1"]
