"""`topics apply --source-*`, `dr failover` and `dr status` on a real broker (the session's, playing
both clusters where a test needs two): a secondary whose topics would not match its primary is
refused in one line; failover commits the newest translated offsets, never backwards, never under
live members; the mirror's lag is found by content, with the outcomes among the missing records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply, describe_configs
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.ops.broker import free_port
from streamsched.ops.dr import (
    CHECKPOINTS_CONFIG,
    PartitionLag,
    _compare,
    ensure_checkpoints_topic,
    failover,
    mirror_status,
)
from streamsched.ops.replay import ReplayRefused
from streamsched.wire.claim import CLAIM_CODEC
from streamsched.wire.mirror import Checkpoint

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamsched", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def definitions(tmp_path: Path, topic: str, partitions: int) -> Path:
    d = tmp_path / "topics"
    d.mkdir(exist_ok=True)
    (d / "t.toml").write_text(f'[[topic]]\nname = "{topic}"\npartitions = {partitions}\n'
                              f'kind = "transition"\n')
    return d


async def test_a_secondary_unlike_its_primary_is_refused_in_one_line(
        bootstrap: str, unique: Callable[[str], str], tmp_path: Path) -> None:
    topic = unique("dr.shape")
    await apply(bootstrap, [TopicSpec(topic, 3, 1)])
    # The primary holds 3 partitions, the definitions the secondary is given say 4.
    proc = cli("topics", "apply", "--bootstrap", bootstrap, "--source-bootstrap", bootstrap,
               "--dir", str(definitions(tmp_path, topic, 4)))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert f"topic {topic} has 3 partitions on the primary cluster, the definition says 4" in proc.stderr

    missing = unique("dr.missing")
    proc = cli("topics", "apply", "--bootstrap", bootstrap, "--source-bootstrap", bootstrap,
               "--dir", str(definitions(tmp_path, missing, 2)))
    assert proc.returncode == 2 and f"topic {missing} does not exist on the primary cluster" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    proc = cli("topics", "apply", "--bootstrap", bootstrap, "--source-bootstrap", bootstrap,
               "--dir", str(definitions(tmp_path, topic, 3)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["unchanged"] == [topic]


async def _checkpoints(bootstrap: str, topic: str, records: list[Checkpoint]) -> None:
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="output")])
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for cp in records:
            await producer.send_and_wait(topic, cp.encode_value(), key=cp.encode_key())
        await producer.send_and_wait(topic, b"\x00\x07not one", key=b"??")  # passed over, not fatal
    finally:
        await producer.stop()


async def _commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, tps: list[TopicPartition]) -> dict[int, int | None]:
    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        consumer.assign(tps)
        return {tp.partition: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()


async def test_failover_commits_the_newest_checkpoint_never_backwards(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic, group, other = unique("dr.t"), unique("dr.g"), unique("dr.other")
    alias = "p" + uuid.uuid4().hex[:8]
    await apply(bootstrap, [TopicSpec(topic, 3, 1)])
    tps = [TopicPartition(topic, p) for p in range(3)]
    await _checkpoints(bootstrap, f"{alias}.checkpoints.internal", [
        Checkpoint(group, topic, 0, 40, 3), Checkpoint(group, topic, 0, 90, 6),  # the newer one counts
        Checkpoint(group, topic, 1, 90, 5), Checkpoint(group, topic, 2, 70, 4),
        Checkpoint(other, topic, 0, 99, 9)])
    await _commit(bootstrap, group, {tps[0]: 2, tps[1]: 8})  # partition 1 is already past its checkpoint

    dry = await failover(bootstrap, [group], f"{alias}.checkpoints.internal", dry_run=True)
    assert {(m.partition, m.committed, m.checkpoint, m.moved) for m in dry} == {
        (0, 2, 6, False), (1, 8, 5, False), (2, None, 4, False)}
    assert await _committed(bootstrap, group, tps) == {0: 2, 1: 8, 2: None}

    moves = await failover(bootstrap, [group], f"{alias}.checkpoints.internal")
    assert {(m.partition, m.moved) for m in moves} == {(0, True), (1, False), (2, True)}
    assert await _committed(bootstrap, group, tps) == {0: 6, 1: 8, 2: 4}
    assert await _committed(bootstrap, other, tps[:1]) == {0: None}  # a group not named is left alone


async def test_dr_mirror_makes_the_checkpoints_topic_compacted_in_short_segments(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic = f"p{uuid.uuid4().hex[:8]}.checkpoints.internal"
    assert await ensure_checkpoints_topic(bootstrap, topic, 1)
    assert not await ensure_checkpoints_topic(bootstrap, topic, 1)  # there already: left alone
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        configs = (await describe_configs(admin, [topic]))[topic]
    finally:
        await admin.close()
    assert {k: configs[k] for k in CHECKPOINTS_CONFIG} == CHECKPOINTS_CONFIG


async def test_failover_is_refused_while_the_group_has_members(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    topic, group = unique("dr.live"), unique("dr.g")
    await apply(bootstrap, [TopicSpec(topic, 1, 1)])
    member = clients.consumer(bootstrap, topic, group_id=group)
    await member.start()
    try:
        deadline = time.monotonic() + 60
        while not member.assignment():
            assert time.monotonic() < deadline, "the member never joined"
            await member.getmany(timeout_ms=200)
        with pytest.raises(ReplayRefused, match="active member"):
            await failover(bootstrap, [group], "primary.checkpoints.internal")
    finally:
        await member.stop()


def _claim(identity: str, *, done: bool) -> bytes:
    outcome = Outcome(OutcomeKind.SUCCEEDED, fence=1, at_ns=1) if done else None
    status = ClaimStatus.RELEASED if done else ClaimStatus.CLAIMED
    return CLAIM_CODEC.encode(ClaimState(identity, status, "w", 1, 0, 1, 2, outcome).to_record())


async def test_lag_is_found_by_content_and_counts_outcomes(bootstrap: str,
                                                          unique: Callable[[str], str]) -> None:
    topic = unique("dr.state")
    await apply(bootstrap, [TopicSpec(topic, 1, 1, kind="state")])
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        values = [_claim(f"sched_{i:02d}", done=i >= 7) for i in range(10)]
        for i, value in enumerate(values):
            await producer.send_and_wait(topic, value, key=f"sched_{i:02d}".encode(), partition=0,
                                         timestamp_ms=1_700_000_000_000 + i)
    finally:
        await producer.stop()
    # The "secondary" holds the first six records: its newest is the sixth.
    newest = (1_700_000_000_005, b"sched_05", values[5])
    primary = clients.consumer(bootstrap)
    await primary.start()
    try:
        lag = PartitionLag(topic, 0, 6, newest[0])
        await _compare(primary, lag, newest, decode_outcomes=True, scan_limit=1000, now_ms=1_700_000_010_006)
    finally:
        await primary.stop()
    assert (lag.behind, lag.outcomes, lag.exact) == (4, 3, True)
    assert lag.behind_s == pytest.approx(10.0)

    # The same cluster as both: nothing behind. An unreachable primary: the secondary's side only.
    same = await mirror_status(bootstrap, bootstrap, [topic], state_topics=[topic])
    assert same.source_reachable and same.behind == 0 and same.outcomes_not_mirrored == 0
    gone = await mirror_status(f"127.0.0.1:{free_port()}", bootstrap, [topic])
    assert not gone.source_reachable and gone.behind is None
    assert [(p.topic, p.mirrored_end) for p in gone.partitions] == [(topic, 10)]
