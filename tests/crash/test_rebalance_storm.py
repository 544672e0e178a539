"""A rebalance storm: members of one worker group join and leave every ~2 s for a minute while
events flow (some due a few seconds later, so they park on the delay topic across rebalances).

aiokafka runs the rebalance listener while the intake task is suspended at an await; before the
owner runtime (streamsched.kafka.owner) serialised the two, a revoke during a restart killed
intake with ``KeyError``, and a revoke + reassign during the restart's sleep orphaned a live
producer. A quarter of the owners also fail on purpose (``STREAMSCHED_OWNER_FAULTS``), so
restarts overlap the rebalances. Proven here on a real broker with real ``streamsched run``
processes: every event
resolved (the group drains), one effect per identity, no identity executed again once its
outcome was stored (the ledger's accepted calls, not its one-row-per-key effects table), fences
strictly increasing, no producer left live or transaction left open, and no task died with an
exception in any member's log.

The storm's choices (joins, leaves, kills, event timing) come from one random generator seeded
by ``STREAMSCHED_STORM_SEED`` (random when unset; the seed is printed and named in failures), so
a failing storm can be replayed: ``STREAMSCHED_STORM_SEED=<seed> pytest <this file>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.harness import Workflow, audit, create_topics, produce
from streamsched.kafka.reads import group_lag
from streamsched.model.event import TransitionEvent
from streamsched.model.names import internal_topic
from streamsched.testing import WorkerProcess, make_event, wait_drained

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

PARTITIONS = 6
STORM_S = 60.0
STEP_S = 2.0
BATCHES = 30
PER_BATCH = 16
ENV = {
    "STREAMSCHED_CLAIM_DURATION_S": "5",
    "STREAMSCHED_SESSION_TIMEOUT": "3s",
    "STREAMSCHED_HEARTBEAT": "0.5s",
    "STREAMSCHED_COMMIT_INTERVAL": "0.05s",
    "STREAMSCHED_LEDGER_LATENCY_S": "0.01",
    # A quarter of all partition owners fail at a random moment within 3 s of being restored,
    # so owner restarts (and their backoff) keep overlapping the rebalances.
    "STREAMSCHED_OWNER_FAULTS": "0.25",
}
KILL_P = 0.2
"""Chance that a leaving member is SIGKILLed rather than sent SIGTERM (at least one always is)."""
BAD_LOG_LINES = ("Traceback", "Task exception was never retrieved", "Future exception was never retrieved",
                 "KeyError")


def batch_events(wf: Workflow, b: int, rng: random.Random,
                 earlier: list[TransitionEvent]) -> list[TransitionEvent]:
    """``PER_BATCH`` new identities (a quarter due a few seconds from now) plus duplicates of
    earlier ones, which may be resolved, in flight or parked when they arrive."""
    now = time.time_ns()
    events = []
    for j in range(PER_BATCH):
        i = b * PER_BATCH + j
        due = now + rng.randint(1, 4) * 10**9 if j % 4 == 0 else 1_700_000_000 * 10**9 + i
        events.append(make_event("due", f"tenant-{i % 5}", [f"storm-{i}"], due_ns=due))
    pool = earlier + events
    for _ in range(PER_BATCH // 4):
        src = rng.choice(pool)
        events.append(make_event(src.type, src.tenant, src.target, due_ns=src.due_ns))
    rng.shuffle(events)
    return events


async def open_transactions(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, records between the last stable offset and the end: an open transaction."""
    ends = {}
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            ends[isolation] = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    return {tp.partition: ends["read_uncommitted"][tp] - ends["read_committed"][tp]
            for tp in ends["read_uncommitted"] if ends["read_uncommitted"][tp] != ends["read_committed"][tp]}


def storm_seed() -> int:
    """``STREAMSCHED_STORM_SEED``, or a fresh random seed."""
    chosen = os.environ.get("STREAMSCHED_STORM_SEED")
    return int(chosen) if chosen else random.SystemRandom().randrange(2**32)


async def test_members_join_and_leave_every_two_seconds(bootstrap: str, tmp_path: Path) -> None:
    seed = storm_seed()
    print(f"rebalance storm: STREAMSCHED_STORM_SEED={seed}")  # shown with a failure's captured output
    replay = f"replay with STREAMSCHED_STORM_SEED={seed}"
    wf = Workflow("due_runs", f".storm-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=PARTITIONS)
    # One generator per task: the feeder and the churn loop interleave by timing, so a shared
    # one would not replay the same choices.
    rng, churn_rng = random.Random(f"{seed}:events"), random.Random(f"{seed}:churn")
    env = {**ENV, **wf.env}
    logs: list[Path] = []
    graceful: list[WorkerProcess] = []

    def member() -> WorkerProcess:
        logs.append(tmp_path / f"member-{len(logs)}.log")
        return WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=logs[-1]).start()

    events: list[TransitionEvent] = []

    async def feed() -> None:
        for b in range(BATCHES):
            batch = batch_events(wf, b, rng, events)
            await produce(bootstrap, wf, batch)
            events.extend(batch)
            await asyncio.sleep(STORM_S / BATCHES)

    anchor = member()  # one member stays throughout, so the group never empties
    churn: list[WorkerProcess] = []
    feeder = asyncio.create_task(feed())
    joins = leaves = kills = 0
    deadline = time.monotonic() + STORM_S
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(STEP_S)
            if not churn or (len(churn) < 2 and churn_rng.random() < 0.6):
                churn.append(member())
                joins += 1
                continue
            leaving = churn.pop(churn_rng.randrange(len(churn)))
            # Past half the storm, the next leave kills if nothing was killed yet.
            overdue = kills == 0 and time.monotonic() >= deadline - STORM_S / 2
            if churn_rng.random() < KILL_P or overdue:
                leaving.kill()  # a crash: its partitions move after the session timeout
                kills += 1
            else:
                leaving.signal(signal.SIGTERM)  # drains, commits, leaves at once
                graceful.append(leaving)
                leaves += 1
        await feeder
        assert joins >= 10 and leaves + kills >= 8, (joins, leaves, kills, replay)
        assert kills >= 1, f"the storm killed no member; it proved less than it says ({replay})"
        for w in churn:
            w.signal(signal.SIGTERM)
            graceful.append(w)
        try:
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
        except TimeoutError:
            topics = (wf.topic, internal_topic("delay", wf.name))
            lags = [await group_lag(bootstrap, wf.group, t) for t in topics]
            raise AssertionError(f"not drained: {lags} ({replay})") from None
        anchor.signal(signal.SIGTERM)
        graceful.append(anchor)
        for w in graceful:
            assert await w.wait_exit(timeout=60) == 0, f"member {w.pid} did not stop cleanly"
    finally:
        feeder.cancel()
        for w in [anchor, *churn, *graceful]:
            if w.alive():
                w.kill()

    result = await audit(bootstrap, wf, events)
    assert result.unique == BATCHES * PER_BATCH, (result, replay)
    # Every event resolved, one effect per identity, fences increase, and no identity called
    # again once its outcome was stored (a killed member's unfinished calls may be repeated).
    assert result.ok, (result, replay)
    # No orphaned producer: every member that stopped cleanly had stopped every producer it
    # created, and no transaction was left open on the state topic by anyone.
    exits = restarts = 0
    for path in logs:
        text = path.read_text(errors="replace")
        for bad in BAD_LOG_LINES:
            assert bad not in text, f"{path.name}: {bad} ({replay})\n{text[-3000:]}"
        restarts += text.count("restarting " + wf.topic)
        for line in text.splitlines():
            if line.startswith('{"scheduler"'):
                exits += 1
                assert json.loads(line)["gauges"].get("producers_live", 0) == 0, (path.name, line)
    assert exits == len(graceful)
    assert restarts >= 5, f"the storm never restarted a failed owner; it proved less than it says ({replay})"
    assert await open_transactions(bootstrap, wf.state_topic) == {}
