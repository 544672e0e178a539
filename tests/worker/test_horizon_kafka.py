"""The claim store and the outcome horizon on a real broker.

* A store restores cold in pages, then warm from its checkpoint (only the tail), and a state
  topic deleted and created again under the same name is detected (its topic id) even when the
  new log is longer than the old checkpoint, where offsets alone cannot tell.
* A worker tombstones an identity resolved before the horizon, in one of its transactions, with
  the raised fence floor; a replay of it runs again with a higher fence; an identity inside the
  horizon is never executed again, across a restart from the local store.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.kafka.txn import BARRIER_KEY
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from streamsched.wire.claim import decode_claim, encode_claim
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.statebase import FLOOR_IDENTITY
from streamsched.worker.store import open_store

pytestmark = pytest.mark.kafka
DAY_NS = 86_400 * 10**9


def resolved(identity: str, fence: int, at_ns: int) -> ClaimState:
    return ClaimState(identity, ClaimStatus.RELEASED, "", fence, 0, fence, 3 * fence,
                      Outcome(OutcomeKind.SUCCEEDED, fence, at_ns))


async def write_claims(bootstrap: str, topic: str, states: list[ClaimState]) -> None:
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, encode_claim(s), key=s.identity.encode(),
                                                   partition=0) for s in states])
    finally:
        await producer.stop()


def counter(metrics: Metrics, key: str) -> int:
    return int(metrics.counters.get(key, 0))


async def test_store_restores_cold_then_only_the_tail_and_detects_a_recreated_topic(
        bootstrap: str, unique: Any, tmp_path: Path) -> None:
    topic = unique("state")
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
    now = time.time_ns()
    first = [resolved(f"sched_a{i}", 1 + i % 3, now) for i in range(50)]
    await write_claims(bootstrap, topic, first)
    env, metrics = StoreEnv(tmp_path), Metrics("h")
    try:
        store = await open_store(env, bootstrap, topic, 0, metrics=metrics)
        assert counter(metrics, "restores{kind=cold}") == 1
        assert counter(metrics, "restore_records{partition=0}") == 50
        assert [store.get(s.identity) for s in first] == first
        store.close()

        tail = [resolved(f"sched_b{i}", 2, now) for i in range(7)]
        await write_claims(bootstrap, topic, tail)
        store = await open_store(env, bootstrap, topic, 0, metrics=metrics)
        assert counter(metrics, "restores{kind=warm}") == 1
        assert counter(metrics, "restore_records{partition=0}") == 50 + 7  # only the tail was read
        assert store.get("sched_b6") == tail[6] and store.get("sched_a7") == first[7]
        store.close()

        # Same name, new incarnation, a longer log than the store's checkpoint (57).
        admin = clients.admin(bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()

        async def recreated() -> bool:
            try:
                await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
            except Exception:  # noqa: BLE001 - the deletion is still in progress
                return False
            return True

        await wait_for(recreated, timeout=60, what="the state topic to be created again")
        second = [resolved(f"sched_c{i}", 1, now) for i in range(80)]
        await write_claims(bootstrap, topic, second)
        store = await open_store(env, bootstrap, topic, 0, metrics=metrics)
        assert counter(metrics, "restores{kind=cold}") == 2
        assert store.get("sched_a7") == ClaimState("sched_a7")  # nothing of the old incarnation
        assert store.get("sched_c79") == second[79]
        store.close()
    finally:
        env.close()


async def test_a_store_left_by_an_earlier_owner_replays_what_later_owners_wrote(
        bootstrap: str, unique: Any, tmp_path: Path) -> None:
    # Owner A's store stays on disk when the partition moves away; owner B (another host)
    # resolves an identity again and tombstones another (its horizon). When A owns the partition
    # again, its store is trusted warm (same cluster and topic incarnation, younger than
    # delete.retention.ms) and the tail it replays carries B's writes, the tombstone included.
    topic = unique("state")
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
    now = time.time_ns()
    mine = [resolved(f"sched_g{i}", 1, now) for i in range(20)]
    await write_claims(bootstrap, topic, mine)
    env, metrics = StoreEnv(tmp_path), Metrics("g")
    try:
        store = await open_store(env, bootstrap, topic, 0, metrics=metrics)
        store.close()  # A leaves; its store stays

        again = resolved("sched_g0", 2, now)  # B: a replay of g0, a higher fence
        await write_claims(bootstrap, topic, [again])
        producer = clients.producer(bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, None, key=b"sched_g1", partition=0)  # B: g1 tombstoned
        finally:
            await producer.stop()

        store = await open_store(env, bootstrap, topic, 0, metrics=metrics)
        assert counter(metrics, "restores{kind=warm}") == 1 and counter(metrics, "restores{kind=cold}") == 1
        assert store.get("sched_g0") == again  # the later owner's fence, not the stale one
        assert store.get("sched_g1") == ClaimState("sched_g1")  # the tombstone applied
        assert store.get("sched_g2") == mine[2]
        store.close()
    finally:
        env.close()


async def test_horizon_tombstones_old_outcomes_and_a_replay_runs_again_with_a_higher_fence(
        bootstrap: str, make_topic: Any, recording_scheduler: Any, tmp_path: Path) -> None:
    topic = await make_topic("h", partitions=1)
    rec = recording_scheduler(topic, prefix="h")
    sched, calls = rec.sched, rec.calls
    old, young, fresh = (make_event("due", "t", [name], due_ns=1) for name in ("old", "young", "fresh"))
    ident = {name: sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)
             for name, ev in (("old", old), ("young", young), ("fresh", fresh))}
    now = time.time_ns()
    await apply(bootstrap, [TopicSpec(sched.state_topic, 1, 1, kind="state")])
    await write_claims(bootstrap, sched.state_topic, [
        resolved(ident["old"], 5, now - 8 * DAY_NS),   # resolved before the 7-day horizon
        resolved(ident["young"], 3, now - 6 * DAY_NS),  # inside it
    ])
    config = {"store_dir": str(tmp_path / "stores"), "outcome_horizon_s": 7 * 86_400.0}

    async def tombstoned() -> bool:
        records = await read_topic(bootstrap, sched.state_topic)
        return any(r.key == ident["old"].encode() and r.value is None for r in records)

    async with running_worker(sched, bootstrap, **config) as worker:
        await wait_for(tombstoned, timeout=60, what="the old identity's tombstone")
        await produce_events(bootstrap, topic, [old, young, fresh])
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
        assert counter(worker.metrics, "restores{kind=cold}") == 1
    by_key = {c.idempotency_key: c for c in calls}
    assert sorted(by_key) == sorted([ident["old"], ident["fresh"]]) and len(calls) == 2  # not "young"
    assert by_key[ident["old"]].fence == 6  # above every fence it had: the floor is 5
    records = await read_topic(bootstrap, sched.state_topic)
    floors = [decode_claim(r.value) for r in records if r.key == FLOOR_IDENTITY.encode()]
    assert [f.fence for f in floors] == [5]
    tomb = next(i for i, r in enumerate(records) if r.value is None and r.key != BARRIER_KEY)
    assert records[tomb].key == ident["old"].encode() and records[tomb + 1].key == FLOOR_IDENTITY.encode()

    # Restart from the local store: replays of all three are inside the horizon now.
    await produce_events(bootstrap, topic, [old, young, fresh])
    async with running_worker(sched, bootstrap, **config) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
        assert counter(worker.metrics, "restores{kind=warm}") == 1
        # The checkpoint was current: the one record read is the owner's own read barrier.
        assert counter(worker.metrics, "restore_records{partition=0}") == 1
        assert counter(worker.metrics, "skipped_outcome") == 3
    assert len(calls) == 2
    claims = [decode_claim(r.value) for r in await read_topic(bootstrap, sched.state_topic)
              if r.value is not None and r.key == ident["old"].encode()]
    fences = [c.fence for c in claims if c.status is ClaimStatus.CLAIMED]
    assert fences == sorted(fences) and fences[0] == 6 and fences[-1] > 6
