"""Client mechanisms behind recovery from a paused broker, pinned down on a three-node cluster.

After a broker was paused (SIGSTOP), partition leaders have moved while a worker's consumer
still holds the old metadata (aiokafka keeps it 300 s by default). A position reset of a delay
partition (it has no committed offset) then asked the old leader, got
``NotLeaderForPartitionError``, and aiokafka 0.14 retried that node every 100 ms without
refreshing metadata; while that reset was pending no fetch went to the node, so other
partitions of the worker stalled too (227 s measured). The client factory now refreshes
metadata every few seconds and whenever an offset lookup fails: the first two tests. The third
gives up a transaction a paused coordinator holds at its (shortened) deadline, on a cluster that
fences the paused broker late enough for the deadline to come first.

The scenario itself (worker processes under load, a broker paused for 30 s, progress bounded
and the black-box audit) is the fault matrix's: tests/faults/test_fault_brokers.py.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from consumers.harness import claim_history, judge_calls
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import coordinators
from streamsched.ops.broker import LocalCluster
from streamsched.testing import wait_drained, wait_for

pytestmark = pytest.mark.kafka

RECOVERY_S = 120.0
"""Every event is resolved this long after the paused coordinator is continued (generous: the
stuck owner restarts with backoff, and the machine is a shared 2-core one)."""


@asynccontextmanager
async def thrown_away(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    """``cluster`` started, and killed at the end: its data is thrown away, so no node is given a
    controlled shutdown to wait for (17 s for these two clusters, measured)."""
    await asyncio.to_thread(cluster.start)
    try:
        yield cluster
    finally:
        for node in list(cluster.procs):
            cluster.kill_node(node, signal.SIGKILL)  # a stopped (SIGSTOP) node dies of it too
        await asyncio.to_thread(cluster.stop)  # what is left: pid files


@pytest.fixture(scope="module")
async def cluster3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    # Kafka's preferred-leader election, every 5 s instead of 300 s: after a pause, leaders move
    # away and soon back, behind every client's cached metadata.
    async with thrown_away(LocalCluster(data_dir=tmp_path_factory.mktemp("paused"), nodes=3, extra_config={
            "leader.imbalance.check.interval.seconds": "5"})) as cluster:
        yield cluster


@pytest.fixture(scope="module")
async def slow_fence_cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    # Kafka fences a silent broker after 60 s here instead of 9 s: a transaction its paused
    # coordinator holds cannot move to another coordinator while the test runs, so only the
    # deadline ends it. (With the default, the clients stop asking the paused broker after one
    # timeout, and a transaction that begins a few seconds into the pause finishes on the
    # coordinator that took over: nothing is stuck, the deadline is not needed.)
    async with thrown_away(LocalCluster(data_dir=tmp_path_factory.mktemp("slowfence"), nodes=3,
                                        extra_config={"broker.session.timeout.ms": "60000"})) as cluster:
        yield cluster


async def _leaders(bootstrap: str, topic: str, **options: Any) -> dict[int, int]:
    admin = clients.admin(bootstrap, **options)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


async def test_a_failed_offset_lookup_forces_a_metadata_refresh(cluster3: LocalCluster) -> None:
    from aiokafka.errors import NotLeaderForPartitionError, UnknownTopicOrPartitionError

    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    await apply(cluster3.bootstrap, [TopicSpec(topic, 1, replication=3)])
    leader = (await _leaders(cluster3.bootstrap, topic))[0]
    follower = next(n.node_id for n in cluster3.specs if n.node_id != leader)
    consumer = clients.consumer(cluster3.bootstrap)
    await consumer.start()
    try:
        refreshes: list[float] = []
        original = consumer._client.force_metadata_update

        def counting() -> Any:
            refreshes.append(time.monotonic())
            return original()

        consumer._client.force_metadata_update = counting
        async def not_leader() -> bool:
            # The position-reset path (ListOffsets to the node the metadata names): a follower
            # answers NOT_LEADER_OR_FOLLOWER, as a deposed leader does after a pause.
            try:
                await consumer._fetcher._proc_offset_request(follower, {topic: [(0, -2)]})
            except UnknownTopicOrPartitionError:
                return False  # the follower has not learnt of the new topic yet
            except NotLeaderForPartitionError:
                return True
            raise AssertionError("a follower answered an offset lookup")

        await wait_for(not_leader, timeout=15, interval=0.1, what="a NOT_LEADER answer")
        assert refreshes, "a failed offset lookup must force a metadata refresh"
    finally:
        await consumer.stop()


async def test_a_reset_against_a_moved_leader_does_not_stall_the_consumer(
        cluster3: LocalCluster) -> None:
    """The stale-metadata mechanism, deterministically: a position reset (a restarting partition seeks a
    delay partition to its beginning) after the leaders moved without the consumer noticing.
    Before: the lookup went to the old leader forever, and no partition that metadata placed on
    that node was fetched again until the metadata max age (300 s). Now: within seconds."""
    from aiokafka import TopicPartition
    from aiokafka.admin import NewTopic

    topic = f"moved-{uuid.uuid4().hex[:8]}"
    victim, *others = [n.node_id for n in cluster3.specs]
    # Clients that must work while the victim is stopped never bootstrap through it.
    reachable = ",".join(n.bootstrap for n in cluster3.specs if n.node_id != victim)
    admin = clients.admin(cluster3.bootstrap)
    await admin.start()
    try:
        # The victim is every partition's preferred leader (first replica).
        await admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={
            p: [victim, *others] for p in range(4)})])
    finally:
        await admin.close()
    await apply(cluster3.bootstrap, [TopicSpec(topic, 4, replication=3)])  # waits until visible
    tps = [TopicPartition(topic, p) for p in range(4)]
    await _produce_round(cluster3.bootstrap, topic, "a")

    async def led_by_victim(expected: bool) -> bool:
        try:
            leaders = await _leaders(reachable, topic, request_timeout_ms=3000)
        except Exception:  # noqa: BLE001 - a stopped broker may time a request out: poll again
            return False
        return all((leader == victim) is expected for leader in leaders.values())

    # Only the fix may refresh this consumer's metadata: the max age stays at aiokafka's 300 s.
    consumer = clients.consumer(reachable, metadata_max_age_ms=300_000)
    cluster3.kill_node(victim, signal.SIGSTOP)
    try:
        await wait_for(lambda: led_by_victim(False), timeout=60, what="leaders to leave the victim")
        await consumer.start()  # sees the interim leaders
        consumer.assign(tps)
        seen = await _collect(consumer, {tp: 5 for tp in tps}, timeout=30)
        consumer.pause(*tps)  # as a restarting partition does

        async def nothing_in_flight() -> bool:
            return not consumer._fetcher._in_flight

        await wait_for(nothing_in_flight, timeout=10, interval=0.05, what="the last fetch")
    finally:
        cluster3.kill_node(victim, signal.SIGCONT)
    try:
        # Back in sync, the victim is made leader again (preferred-leader election every 5 s).
        await wait_for(lambda: led_by_victim(True), timeout=60, what="leaders to return to the victim")
        assert consumer._client.cluster.leader_for_partition(tps[0]) != victim, "metadata not stale"
        await _produce_round(cluster3.bootstrap, topic, "b")
        started = time.monotonic()
        # One offset lookup, to the old leader (aiokafka waits for it up to its request timeout).
        await consumer.seek_to_beginning(tps[0])
        consumer.resume(*tps)
        more = await _collect(consumer, {tps[0]: 10, **{tp: 5 for tp in tps[1:]}},
                              timeout=max(0.0, 15 - (time.monotonic() - started)))
        assert sorted(more[tps[0]]) == sorted(f"{t}{i}".encode() for t in "ab" for i in range(5))
        assert all(sorted(seen[tp]) == sorted(f"a{i}".encode() for i in range(5)) for tp in tps)
    finally:
        await consumer.stop()


async def _produce_round(bootstrap: str, topic: str, tag: str) -> None:
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for p in range(4):
            for i in range(5):
                await producer.send_and_wait(topic, f"{tag}{i}".encode(), partition=p)
    finally:
        await producer.stop()


async def _collect(consumer: Any, want: dict[Any, int], *, timeout: float) -> dict[Any, list[bytes]]:
    """Values fetched per partition until ``want`` of each arrived; fail past ``timeout``."""
    seen: dict[Any, list[bytes]] = {tp: [] for tp in want}
    deadline = time.monotonic() + timeout
    while any(len(seen[tp]) < n for tp, n in want.items()):
        counts = {tp.partition: len(v) for tp, v in seen.items()}
        assert time.monotonic() < deadline, f"consumer stalled with {counts} records"
        for tp, records in (await consumer.getmany(timeout_ms=200)).items():
            seen[tp].extend(r.value for r in records)
    return seen


async def test_a_transaction_a_paused_broker_holds_is_given_up_at_its_deadline(
        slow_fence_cluster: LocalCluster, recording_scheduler: Any) -> None:
    """The transaction deadline (streamsched/kafka/txn.py) on a real cluster. The transaction
    coordinator of partition 0's producer is paused (SIGSTOP) for longer than the deadline while
    that partition has work: its transaction cannot commit (aiokafka would wait for its 30 s
    request timeout and retry). The owner gives the transaction up at the deadline
    (``stuck_transactions``), restarts on a fresh producer, and once the broker is back every
    event is resolved."""
    from aiokafka.admin import NewTopic

    from streamsched.kafka.owner import RestartPolicy
    from streamsched.kafka.writer import partition_for_key
    from streamsched.model.identity import route_key
    from streamsched.testing import make_event, produce_events, running_worker

    # Only the transaction coordinator is paused: a scheduler whose consumer group has its
    # coordinator on the same node would also lose its group, and a session that expires before
    # the deadline revokes the partition (and cancels the stuck transaction) first.
    for _ in range(10):
        topic = f"stuck-{uuid.uuid4().hex[:8]}"
        rec = recording_scheduler(topic)
        sched = rec.sched
        found = await coordinators(slow_fence_cluster.bootstrap, sched.group, topic, 1)
        victim = found.transactions[0]
        if found.group != victim:
            break
    else:
        raise AssertionError("no scheduler name put its group and transaction coordinators apart")
    admin = clients.admin(slow_fence_cluster.bootstrap)
    await admin.start()
    try:
        live = [n.node_id for n in slow_fence_cluster.specs if n.node_id != victim]
        # The input lives on the other two nodes only, so this test can produce while it is paused.
        await admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={p: live for p in range(3)})])
    finally:
        await admin.close()
    await apply(slow_fence_cluster.bootstrap, [TopicSpec(topic, 3, replication=2)])  # waits until visible
    reachable = ",".join(n.bootstrap for n in slow_fence_cluster.specs if n.node_id != victim)

    def events(tag: str) -> list[Any]:
        """Ten events per partition."""
        per: dict[int, list[Any]] = {p: [] for p in range(3)}
        for i in itertools.count():
            ev = make_event("due", "t", [f"{tag}{i}"])
            bucket = per[partition_for_key(route_key(ev.tenant, ev.target), 3)]
            if len(bucket) < 10:
                bucket.append(ev)
            if all(len(b) == 10 for b in per.values()):
                return [ev for b in per.values() for ev in b]
        raise AssertionError("unreachable")

    before, during = events("a"), events("b")
    await produce_events(reachable, topic, before)
    async with running_worker(sched, slow_fence_cluster.bootstrap, transaction_deadline_s=5.0,
                              heartbeat_interval_ms=1000,
                              restart=RestartPolicy(initial_s=0.5, max_s=2.0)) as worker:
        await wait_drained(slow_fence_cluster.bootstrap, sched.group, topic, timeout=120)
        slow_fence_cluster.kill_node(victim, signal.SIGSTOP)
        try:
            await produce_events(reachable, topic, during)

            async def gave_up() -> bool:
                return worker.metrics.counters.get("stuck_transactions", 0) >= 1

            await wait_for(gave_up, timeout=30, what="a transaction given up at its 5 s deadline")
        finally:
            slow_fence_cluster.kill_node(victim, signal.SIGCONT)
        await wait_drained(slow_fence_cluster.bootstrap, sched.group, topic, timeout=RECOVERY_S)
    assert set(rec.per_identity()) == rec.identities(before + during)
    # The given-up transaction's effects ran without a stored outcome and may run again; an
    # identity whose outcome was stored must not.
    judged = judge_calls([(c.idempotency_key, c.fence) for c in rec.calls],
                         await claim_history(slow_fence_cluster.bootstrap, sched.state_topic))
    assert judged.after_outcome == {} and judged.unbacked == [], judged
