"""A restore reaches its owner's read barrier or refuses to start (real broker).

A broker cut off from the cluster serves its old log, and a client that found the cluster
through it reads an end that misses what the real leader took since; tests/faults' broker cut
shows it end to end. Here: the barrier's offset is a committed record's, the restore that
reaches it sees the partition as before (the tombstone is nobody's identity), and one that ends
before it is refused, in memory and on disk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from streamsched.errors import ChangelogBehind
from streamsched.kafka import changelog, clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.changelog import PartitionReader
from streamsched.kafka.txn import BARRIER_KEY, read_barrier
from streamsched.model.claims import ClaimState
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
