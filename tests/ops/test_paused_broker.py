"""A broker paused (SIGSTOP) for 30 s in a three-node cluster: the worker recovers within seconds.

Defect 4o: after such a pause, partition leaders have moved while the worker's consumer still
holds the old metadata (aiokafka keeps it 300 s by default). A position reset of a delay
partition (it has no committed offset) then asked the old leader, got
``NotLeaderForPartitionError``, and aiokafka 0.14 retried that node every 100 ms without
refreshing metadata; while that reset was pending no fetch went to the node, so other
partitions of the worker stalled too (227 s measured). The client factory now refreshes
metadata every few seconds and whenever an offset lookup fails.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from consumers.harness import Workflow, audit, build_events, claim_history, judge_calls, produce
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import group_lag
from streamsched.model.names import internal_topic
from streamsched.ops.broker import LocalCluster
from streamsched.testing import WorkerProcess, wait_drained, wait_for

pytestmark = pytest.mark.kafka

PAUSE_S = 30.0
RECOVERY_S = 120.0
"""Everything produced before, during and after the pause is resolved this long after resume.

Items whose handler timed out during the pause come back through the delay topic with their
retry backoff, and 5 s leases are honoured, so recovery takes tens of seconds; one run on a
loaded 2-core machine (load average ~4.5) needed more than 60 s. The defect this guards against
stalled partitions for 227 s."""


@pytest.fixture(scope="module")
async def cluster3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    # Kafka's preferred-leader election, every 5 s instead of 300 s: after a pause, leaders move
    # away and soon back, behind every client's cached metadata.
    async with LocalCluster(data_dir=tmp_path_factory.mktemp("paused"), nodes=3,
                            extra_config={"leader.imbalance.check.interval.seconds": "5"}) as cluster:
        try:
            yield cluster
        finally:
            for node in cluster.procs:
                cluster.kill_node(node, signal.SIGCONT)  # never leave a stopped JVM behind


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
    """The mechanism of 4o, deterministically: a position reset (a restarting partition seeks a
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


async def test_worker_drains_within_seconds_after_a_paused_broker(cluster3: LocalCluster,
                                                                   tmp_path: Path) -> None:
    bootstrap = cluster3.bootstrap
    wf = Workflow("due_runs", f".pause-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    delay = internal_topic("delay", wf.name)
    # Every topic replicated three ways, so leaders move while a broker is stopped.
    await apply(bootstrap, [
        TopicSpec(wf.topic, 6, replication=3),
        TopicSpec(wf.state_topic, 6, replication=3, kind="state"),
        TopicSpec(internal_topic("dlq", wf.name), 6, replication=3, kind="dead_letter"),
        TopicSpec(delay, 6, replication=3, kind="delay"),
    ])
    events = build_events(wf, unique=90, duplicates=30)
    before, during, after = events[:40], events[40:80], events[80:]
    await produce(bootstrap, wf, before)
    log = tmp_path / "worker.log"
    worker = WorkerProcess(wf.app_ref, bootstrap, log_path=log, env={
        **wf.env, "STREAMSCHED_CLAIM_DURATION_S": "5", "STREAMSCHED_SESSION_TIMEOUT": "6s",
        "STREAMSCHED_HEARTBEAT": "1s"}).start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
        # Pause the group's coordinator: the member must rejoin and re-resolve its positions,
        # delay partitions (no committed offset) by an offset lookup, while leaders move.
        admin = clients.admin(bootstrap)
        await admin.start()
        try:
            victim = int(await admin.find_coordinator(wf.group))
        finally:
            await admin.close()
        await produce(bootstrap, wf, during)
        cluster3.kill_node(victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)  # the fault itself, not a synchronisation
        finally:
            cluster3.kill_node(victim, signal.SIGCONT)
        resumed = time.monotonic()
        await produce(bootstrap, wf, after)
        try:
            await wait_drained(bootstrap, wf.group, wf.topic,
                               timeout=RECOVERY_S - (time.monotonic() - resumed))
        except TimeoutError:
            lag = {}
            for name, t in (("transition", wf.topic), ("delay", delay)):
                got = await group_lag(bootstrap, wf.group, t)
                lag[name] = {p: got.end[p] - got.committed.get(p, 0) for p in got.end}
            worker.terminate()  # its last log line is its metrics (restarts, given-up partitions)
            failed_lookups = log.read_text(errors="replace").count("Failed fetch offsets")
            pytest.fail(f"worker did not drain {RECOVERY_S:.0f}s after broker {victim} resumed "
                        f"({failed_lookups} failed offset lookups logged); lag per partition "
                        f"{lag}; worker log:\n{worker.log_tail(60)}")
        assert worker.alive(), "the worker died during the broker pause"
    finally:
        assert worker.terminate() == 0
    result = await audit(bootstrap, wf, events)
    assert result.missing == 0 and result.extra_effects == 0, result
    assert result.effects == result.unique == 90, result
    # Calls whose outcome the pause kept from being stored may be repeated; none that was stored.
    assert result.reexecuted == () and result.unbacked == (), result


async def test_a_transaction_a_paused_broker_holds_is_given_up_at_its_deadline(
        cluster3: LocalCluster, recording_scheduler: Any) -> None:
    """The transaction deadline (streamsched/kafka/txn.py) on a real cluster. The transaction
    coordinator of partition 0's producer is paused (SIGSTOP) for longer than the deadline while
    that partition has work: its transaction cannot commit (aiokafka would wait for its 30 s
    request timeout and retry). The owner gives the transaction up at the deadline
    (``stuck_transactions``), restarts on a fresh producer, and once the broker is back every
    event is resolved."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import GroupCoordinatorNotAvailableError

    from streamsched.kafka.owner import RestartPolicy
    from streamsched.kafka.writer import partition_for_key
    from streamsched.model.identity import route_key
    from streamsched.model.names import transactional_id
    from streamsched.testing import make_event, produce_events, running_worker

    admin = clients.admin(cluster3.bootstrap)
    await admin.start()
    try:
        found: list[int] = []

        async def coordinator(key: str, kind: int) -> bool:
            try:  # the first lookup on a fresh cluster creates the coordinator's internal topic
                found.append(int(await admin.find_coordinator(key, coordinator_type=kind)))
            except GroupCoordinatorNotAvailableError:
                return False
            return True

        # Only the transaction coordinator is paused: a scheduler whose consumer group has its
        # coordinator on the same node would also lose its group, and a session that expires
        # before the deadline revokes the partition (and cancels the stuck transaction) first.
        for _ in range(10):
            topic = f"stuck-{uuid.uuid4().hex[:8]}"
            rec = recording_scheduler(topic)
            sched = rec.sched
            tid = transactional_id("scheduler", sched.group, topic, partition=0)
            await wait_for(functools.partial(coordinator, tid, 1), timeout=60,
                           what="the transaction coordinator")
            victim = found[-1]
            await wait_for(functools.partial(coordinator, sched.group, 0), timeout=60,
                           what="the group coordinator")
            if found[-1] != victim:
                break
        else:
            raise AssertionError("no scheduler name put its group and transaction coordinators apart")
        live = [n.node_id for n in cluster3.specs if n.node_id != victim]
        # The input lives on the other two nodes only, so this test can produce while it is paused.
        await admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={p: live for p in range(3)})])
    finally:
        await admin.close()
    await apply(cluster3.bootstrap, [TopicSpec(topic, 3, replication=2)])  # waits until visible
    reachable = ",".join(n.bootstrap for n in cluster3.specs if n.node_id != victim)

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
    async with running_worker(sched, cluster3.bootstrap, transaction_deadline_s=5.0,
                              heartbeat_interval_ms=1000,
                              restart=RestartPolicy(initial_s=0.5, max_s=2.0)) as worker:
        await wait_drained(cluster3.bootstrap, sched.group, topic, timeout=120)
        cluster3.kill_node(victim, signal.SIGSTOP)
        try:
            await produce_events(reachable, topic, during)

            async def gave_up() -> bool:
                return worker.metrics.counters.get("stuck_transactions", 0) >= 1

            await wait_for(gave_up, timeout=30, what="a transaction given up at its 5 s deadline")
        finally:
            cluster3.kill_node(victim, signal.SIGCONT)
        await wait_drained(cluster3.bootstrap, sched.group, topic, timeout=RECOVERY_S)
    assert set(rec.per_identity()) == rec.identities(before + during)
    # The given-up transaction's effects ran without a stored outcome and may run again; an
    # identity whose outcome was stored must not.
    judged = judge_calls([(c.idempotency_key, c.fence) for c in rec.calls],
                         await claim_history(cluster3.bootstrap, sched.state_topic))
    assert judged.after_outcome == {} and judged.unbacked == [], judged
