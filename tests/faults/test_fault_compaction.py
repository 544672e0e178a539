"""The state topic compacted under the workers, then every worker SIGKILLed and restarted.

The state topic is the changelog every claim store restores from, and a compacted topic keeps
only each identity's latest snapshot. This scenario makes the broker compact it for real: the
topic is created (before any worker) with segments that roll every second and a cleaner that
takes any dirty segment (``min.cleanable.dirty.ratio=0.01``, ``min.compaction.lag.ms=0``), the
workload runs, and the test waits until compaction is observable: every identity was written at
least twice (its claim, then its release), and at least half of them have one snapshot left in
the log. Then both workers are SIGKILLed and restarted (one on its own store: a warm restore
from its checkpoint; one on an empty directory: a cold restore from the compacted log), and every
event is replayed: nothing executes again, every identity keeps its one effect, its outcome and
increasing fences.

The shared single-node broker is enough: compaction is one broker's log cleaner on its own
replica, which a three-node cluster does the same way on each (what replication adds is the
network scenarios' subject). About 20-60 s (the broker's cleaner backs off up to 15 s).
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from consumers.harness import CRASH_ENV, Workflow, audit, build_events, create_topics, produce
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.testing import WorkerProcess, make_event, wait_drained, wait_for
from tests.faults.fault_logs import RestartBound, judge_logs
from tests.faults.skew_disk_support import accepted_calls, logs_of, members_are, reexecuted

pytestmark = [pytest.mark.faults, pytest.mark.kafka]

COMPACTION_RESTARTS = RestartBound(0, ("no owner fails here: the killed workers' successors are new "
                                       "processes, and a compacted changelog is an ordinary restore"))

COMPACT_SOON = {"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}


def final_counters(log: Path) -> dict[str, int]:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"counters"' in line:
            return json.loads(line)["counters"]  # type: ignore[no-any-return]
    raise AssertionError(f"no metrics snapshot in {log}")


async def snapshots_per_identity(bootstrap: str, wf: Workflow) -> Counter[bytes]:
    return Counter(rec.key for rec in await read_topic(bootstrap, wf.state_topic)
                   if rec.key is not None and rec.value is not None)


async def test_a_compacted_state_topic_and_every_worker_killed_execute_nothing_again(
        bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".compact-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=2)
    await apply(bootstrap, [TopicSpec(wf.state_topic, 2, kind="state", config=dict(COMPACT_SOON))])
    events = build_events(wf, unique=150, duplicates=50, noise=4)
    await produce(bootstrap, wf, events)
    env = {**CRASH_ENV, **wf.env}

    def worker(name: str, store: str) -> WorkerProcess:
        return WorkerProcess(wf.app_ref, bootstrap, log_path=tmp_path / f"{name}.log",
                             env={**env, "STREAMSCHED_STORE_DIR": str(tmp_path / store)})

    first = [worker("a", "a").start(), worker("b", "b").start()]
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=90)
        rolled = 0

        async def compacted() -> bool:
            nonlocal rolled
            # Every identity was written at least twice (its claim, before its effect, then its
            # release with the outcome): one snapshot left is the cleaner's doing.
            now = await snapshots_per_identity(bootstrap, wf)
            if sum(1 for n in now.values() if n == 1) >= len(now) // 2:
                return True
            # A segment is cleaned once it is no longer the active one: a few more identities
            # append to both state partitions, which rolls them (segment.ms has passed).
            more = [make_event(wf.event_type, "tenant-roll", [f"roll-{rolled}-{i}"],
                               due_ns=1_700_000_200 * 10**9 + rolled * 10 + i) for i in range(4)]
            rolled += 1
            events.extend(more)
            await produce(bootstrap, wf, more)
            return False

        await wait_for(compacted, timeout=90, interval=3.0, what="the state topic compacted")
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=60)
    finally:
        for w in first:
            w.signal(signal.SIGKILL)
    for w in first:
        assert await w.wait_exit(timeout=30) == -signal.SIGKILL

    calls = accepted_calls(wf)
    # One back on its own store (warm), one on an empty directory (cold, from the compacted log).
    second = [worker("a2", "a").start(), worker("b2", "fresh").start()]
    try:
        # Both own a partition (each restored it) before the replay arrives.
        await wait_for(lambda: members_are(bootstrap, wf.group, *second), timeout=60,
                       what="both restarted workers in the group, the killed ones gone")
        replay = [make_event(ev.type, ev.tenant, ev.target, due_ns=ev.due_ns) for ev in events]
        await produce(bootstrap, wf, replay)
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=90)
    finally:
        codes = {w.log_path: w.terminate() for w in second if w.alive()}
    assert set(codes.values()) <= {0}, codes

    assert accepted_calls(wf) == calls, "an identity executed again after the restart"
    assert await reexecuted(bootstrap, wf) == {}
    restores = Counter[str]()
    for name in ("a2", "b2"):
        for key, n in final_counters(tmp_path / f"{name}.log").items():
            if key.startswith("restores{"):
                restores[key] += n
    assert restores["restores{kind=cold}"] >= 1, restores
    result = await audit(bootstrap, wf, events)
    assert result.missing == 0 and result.extra_effects == 0, result
    assert result.effects == result.unique, result
    assert result.fences_ok and result.all_released, result
    assert not result.reexecuted and not result.unbacked and result.retried == 0, result
    judge_logs(logs_of(tmp_path, "a", "b", "a2", "b2"), restarts=COMPACTION_RESTARTS, owners_only=True)
