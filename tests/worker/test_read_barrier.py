"""A restore reaches its owner's read barrier or refuses to start (real broker).

A broker cut off from the cluster serves its old log, and a client that found the cluster
through it reads an end that misses what the real leader took since; tests/faults' broker cut
shows it end to end. Here: the barrier's offset is a committed record's, the restore that
reaches it sees the partition as before (the tombstone is nobody's identity), and one that ends
before it is refused, in memory and on disk.

An earlier owner that crashed inside a transaction leaves it open until its timeout, and it holds
the partition's stable end before the new owner's barrier: the restore waits it out (the leader's
high watermark shows the barrier, so this is no stale leader), and reads what it decided.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from streamsched.errors import ChangelogBehind
from streamsched.kafka import changelog, clients, compat_offsets
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.changelog import PartitionReader, ReaderPool
from streamsched.kafka.txn import BARRIER_KEY, read_barrier
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import encode_claim
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.store import open_store, restore
from tests.worker.test_horizon_kafka import resolved, write_claims

pytestmark = pytest.mark.kafka


async def test_a_restore_must_reach_the_read_barrier(bootstrap: str, unique: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique("state")
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
    claims = [resolved(f"sched_r{i}", 1, time.time_ns()) for i in range(5)]
    await write_claims(bootstrap, topic, claims)
    producer = clients.transactional_producer(bootstrap, unique("tx-barrier"))
    await producer.start()
    try:
        barrier = await read_barrier(producer, topic, 0)
    finally:
        await producer.stop()
    assert barrier == 6  # past the tombstone at offset 5; its commit marker follows
    async with PartitionReader(bootstrap, topic, 0) as reader:
        # Once its commit marker is written: the commit returns before that.
        assert (await reader.bounds(min_end=7)).end == 7

    state = await restore(bootstrap, topic, 0, min_end=barrier)
    assert state.identities() == 5 and state.get("sched_r4") == claims[4]
    env = StoreEnv(tmp_path)
    try:
        store = await open_store(env, bootstrap, topic, 0, min_end=barrier)
        assert store.get("sched_r0") == claims[0]
        assert store.get(BARRIER_KEY.decode()) == ClaimState(BARRIER_KEY.decode())  # nobody's
        store.close()
        # An end before the barrier, as a stale leader's would be: refused, whatever is stored
        # (after waiting for it a little: here it never comes).
        monkeypatch.setattr(changelog, "MIN_END_WAIT_S", 0.3)
        with pytest.raises(ChangelogBehind, match=r"\(7\) is behind offset 20"):
            await restore(bootstrap, topic, 0, min_end=20)
        with pytest.raises(ChangelogBehind):
            await open_store(env, bootstrap, topic, 0, min_end=20)
    finally:
        env.close()


@pytest.mark.parametrize("pooled", [False, True], ids=["own-consumer", "pooled"])
async def test_a_restore_waits_out_an_earlier_owners_open_transaction(
        bootstrap: str, unique: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        pooled: bool) -> None:
    topic = unique("state")
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
    kept = [resolved(f"sched_k{i}", 1, time.time_ns()) for i in range(3)]
    await write_claims(bootstrap, topic, kept)
    # The earlier owner: a claim sent in a transaction it never ends (as if it crashed there).
    earlier = clients.transactional_producer(bootstrap, unique("tx-earlier"))
    ours = clients.transactional_producer(bootstrap, unique("tx-ours"))
    await earlier.start()
    await ours.start()
    pool = ReaderPool(bootstrap, 1) if pooled else None
    try:
        await earlier.begin_transaction()
        undecided = resolved("sched_undecided", 1, time.time_ns())
        await earlier.send_and_wait(topic, encode_claim(undecided), key=b"sched_undecided", partition=0)
        barrier = await read_barrier(ours, topic, 0)
        async with PartitionReader(bootstrap, topic, 0) as probe:
            stable = (await probe.bounds()).end
            high = await compat_offsets.high_watermark(probe._consumer, probe.tp)
        assert stable == 3 < barrier <= (high or 0), (stable, barrier, high)

        monkeypatch.setattr(changelog, "MIN_END_WAIT_S", 0.3)
        caplog.set_level(logging.INFO, logger="streamsched.kafka.changelog")
        restoring = asyncio.ensure_future(restore(bootstrap, topic, 0, min_end=barrier, pool=pool))
        deadline = time.monotonic() + 30
        while "an open transaction" not in caplog.text:
            assert time.monotonic() < deadline, "the restore never found the open transaction"
            assert not restoring.done(), restoring.exception()
            await asyncio.sleep(0.05)
        assert not restoring.done()  # past the stale-leader wait, still waiting
        await earlier.abort_transaction()
        state = await asyncio.wait_for(restoring, 30)
        assert state.identities() == 3 and state.get("sched_undecided") == ClaimState("sched_undecided")
    finally:
        if pool is not None:
            await pool.close()
        await earlier.stop()
        await ours.stop()
