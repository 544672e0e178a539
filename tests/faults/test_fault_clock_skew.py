"""Workers and schedule tickers whose wall clocks are five minutes apart (libfaketime).

One process runs with its clock 5 minutes ahead (``FAKETIME=+300``), one 5 minutes behind
(``-300``); only the wall clock is shifted (``FAKETIME_DONT_FAKE_MONOTONIC=1``: asyncio's timers,
aiokafka's timeouts and thread waits run on the monotonic clock and keep working; checked in a
child first, :func:`~tests.faults.skew_disk_support.check_skew`).

**What a claim's lease is, and what this scenario proves about it.** A claim carries
``lease_expires_ns`` = the claimant's wall clock + the claim duration. A new owner honours another
owner's claim until the lease ends by its *own* wall clock and, as well, for one whole claim
duration from when it first saw the claim on its monotonic clock (``selection.py``:
``lease_waits``): the claim was written before it was seen, so a clock running ahead never takes
a lease early, and one running behind waits up to its lag longer. Exactly-once of effects rests
on fencing, not on clocks: a partition's new owner fences every earlier owner's producer, every
claim mints a higher fence than all before it and is committed before its effect, and the
destination refuses a call whose fence is below one it already saw. Asserted here:

* no identity is executed after its outcome was stored (judged by fence, clock-free);
* every identity has exactly one effect, fences strictly increase, every claim is released;
* no claim is taken before the lease it replaces ended in real time (libfaketime's offsets are
  exact, so each claim's real time follows from its owner's offset);
* a claim is only ever taken over from the worker that was killed or paused, and an identity is
  executed twice only if that worker died between its effect and its outcome (at-least-once by
  design for external commands, the second call with a higher fence).

The killed worker is the slow one: a surviving slow-clock worker would wait for a dead fast-clock
worker's leases for the skew (10 minutes here), which is the liveness price of the design, not a
wrong answer, and too long for a CI scenario.

**Schedules.** A ticker anchors a new schedule at its own now; a ticker whose clock is ahead
fires up to its now, and one behind it, taking the partition over, waits rather than fire again.
Each occurrence is an idempotent ``<schedule>/<planned>`` event fired in one transaction with the
schedule's advanced state, so every occurrence fires once and none is skipped, whichever clock
fired it: asserted across a slow ticker, a fast one joining, the slow one killed and a
normal-clock one joining.

The shared single-node broker is enough: the fault is the processes' clocks (the broker's clock
and the cluster's replication are not involved), so a three-node cluster would add nothing to
what this shows. About 60-100 s for both tests.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from consumers.harness import (
    CRASH_ENV,
    Workflow,
    audit,
    build_events,
    claim_history,
    create_topics,
    produce,
    seeded_workflow,
)
from consumers.ledger import Ledger
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.schedules.catalog import Catalog
from streamsched.testing import WorkerProcess, kit, make_event, wait_drained, wait_for
from streamsched.wire.transition import decode_transition
from tests.faults.fault_logs import RestartBound, judge_logs
from tests.faults.skew_disk_support import (
    accepted_calls,
    check_skew,
    logs_of,
    members_are,
    reexecuted,
    refused_calls,
    skewed_env,
)

pytestmark = [pytest.mark.faults, pytest.mark.kafka]

AHEAD, BEHIND = 300, -300
NO_OWNER_FAILS = ("no owner fails here: a killed or paused process's partitions move by rebalance and "
                  "fencing, which restarts nothing (the resumed one is killed before an unconfirmed fence "
                  "would restart after 30 s); a restart would answer an owner failure no clock explains")
SKEWED_WORKERS_RESTARTS = PAUSED_ZOMBIE_RESTARTS = SKEWED_TICKERS_RESTARTS = RestartBound(0, NO_OWNER_FAILS)


def takeovers(history: dict[str, list[ClaimState]]) -> list[tuple[str, str]]:
    """(previous owner, new owner) of every claim taken while another owner held it (claimed or
    outcome stored, not released): what a lease is there to delay."""
    out = []
    for states in history.values():
        holder = None
        for st in states:
            if st.status is ClaimStatus.CLAIMED and holder is not None and st.owner != holder:
                out.append((holder, st.owner))
            holder = st.owner if st.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED) else None
    return out


def early_takeovers(history: dict[str, list[ClaimState]], offsets: dict[str, int],
                    duration_s: float) -> list[tuple[str, float]]:
    """(identity, seconds early) of every claim taken from another owner before that owner's lease
    ended in real time. Each lease end is the claimant's wall clock plus ``duration_s``; an owner
    whose name contains a key of ``offsets`` ran that many seconds off (libfaketime's offset is
    exact), the others on the real clock."""
    def offset_ns(owner: str) -> int:
        return next((int(s * 1e9) for tag, s in offsets.items() if tag in owner), 0)

    duration_ns = int(duration_s * 1e9)
    out = []
    for identity, states in history.items():
        holder: ClaimState | None = None
        for st in states:
            if st.status is ClaimStatus.CLAIMED and holder is not None and st.owner != holder.owner:
                taken_real = st.lease_expires_ns - offset_ns(st.owner) - duration_ns
                ended_real = holder.lease_expires_ns - offset_ns(holder.owner)
                if taken_real < ended_real:
                    out.append((identity, round((ended_real - taken_real) / 1e9, 3)))
            holder = st if st.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED) else None
    return out


def final_counters(log: Path) -> dict[str, int]:
    """The counters of the metrics snapshot ``streamsched run`` prints when it exits."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"counters"' in line:
            return json.loads(line)["counters"]  # type: ignore[no-any-return]
    raise AssertionError(f"no metrics snapshot in {log}")


@pytest.fixture(scope="module", autouse=True)
def _faketime_works() -> None:
    check_skew(AHEAD)
    check_skew(BEHIND)


async def test_workers_five_minutes_apart_execute_each_identity_once(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".skew-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=4)
    events = build_events(wf, unique=200, duplicates=80, noise=4)
    env = {**CRASH_ENV, **wf.env}

    def worker(name: str, offset: int | None, **extra: str) -> WorkerProcess:
        clock = skewed_env(offset) if offset is not None else {}
        return WorkerProcess(wf.app_ref, bootstrap, log_path=tmp_path / f"{name}.log",
                             env={**env, **clock, "STREAMSCHED_STORE_DIR": str(tmp_path / name), **extra})

    fast = worker("fast", AHEAD).start()
    slow = worker("slow", BEHIND, STREAMSCHED_FAILPOINT="after_effect:40").start()
    normal: WorkerProcess | None = None
    try:
        # The load arrives once both are members, so both take a share of it.
        await wait_for(lambda: members_are(bootstrap, wf.group, fast, slow), timeout=60,
                       what="both workers in the group")
        await produce(bootstrap, wf, events)
        # The slow worker dies mid-run (SIGKILL right after an effect, before its outcome); the
        # fast one takes its partitions over.
        assert await slow.wait_exit(timeout=90) == -signal.SIGKILL, slow.log_tail()

        async def taken_over_by_fast() -> bool:
            return any(f"-{slow.pid}-" in a and f"-{fast.pid}-" in b
                       for a, b in takeovers(await claim_history(bootstrap, wf)))

        await wait_for(taken_over_by_fast, timeout=60, what="the fast worker taking the dead one's claims")
        # A normal-clock worker joins: a rebalance hands partitions over from the fast one.
        normal = worker("normal", None).start()
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
        # The same events again, later: every one resolves from its stored outcome.
        before = accepted_calls(wf)
        replay = [make_event(ev.type, ev.tenant, ev.target, due_ns=ev.due_ns) for ev in events]
        await produce(bootstrap, wf, replay)
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
        assert accepted_calls(wf) == before, "a replayed identity executed again"
    finally:
        if slow.alive():
            slow.kill()  # the scenario failed before its failpoint: never leave it running
        codes = {w.log_path: w.terminate() for w in (fast, normal) if w is not None and w.alive()}
    assert set(codes.values()) <= {0}, codes

    # By fence only: the audit's check by time compares the ledger's call times with the state
    # records' timestamps, both from the workers' own (here skewed) clocks.
    assert await reexecuted(bootstrap, wf) == {}, "executed after its outcome was stored"
    result = await audit(bootstrap, wf, events)
    assert result.missing == 0 and result.extra_effects == 0, result
    assert result.effects == result.unique == 200, result
    assert result.fences_ok and result.all_released, result

    # Claims changed owner only from the killed worker: no live worker's lease was taken.
    dead = f"-{slow.pid}-"
    history = await claim_history(bootstrap, wf)
    taken_from = {a for a, _b in takeovers(history)}
    assert taken_from and all(dead in owner for owner in taken_from), taken_from
    skews = {dead: BEHIND, f"-{fast.pid}-": AHEAD}
    assert early_takeovers(history, skews, float(CRASH_ENV["STREAMSCHED_CLAIM_DURATION_S"])) == []
    # Twice only where the killed worker died between an effect and its outcome.
    died_holding = {i for i, states in history.items()
                    if any(dead in st.owner and st.status is ClaimStatus.CLAIMED for st in states)}
    twice = {k for k, n in accepted_calls(wf).items() if n > 1}
    assert twice <= died_holding, twice - died_holding
    assert not refused_calls(wf), "a stale fence reached the ledger"
    judge_logs(logs_of(tmp_path, "fast", "slow", "normal"), restarts=SKEWED_WORKERS_RESTARTS,
               owners_only=True)


async def test_a_fast_clock_waits_out_a_paused_workers_live_claims(bootstrap: str, tmp_path: Path) -> None:
    """A worker paused (SIGSTOP) in its external call holds claims with a 20 s lease; a successor
    5 minutes ahead sees them expired by its wall clock, and still takes none before its lease
    ends in real time: it watches each for a whole claim duration on its monotonic clock. The
    paused worker, resumed, reaches the ledger with its stale fence (refused) and is fenced out
    of Kafka."""
    wf, events = await seeded_workflow(bootstrap, "due_runs", "skewzombie", tmp_path, partitions=2,
                                       unique=12, duplicates=4)
    duration_s = 20
    env = {**CRASH_ENV, **wf.env, "STREAMSCHED_CLAIM_DURATION_S": str(duration_s)}
    zombie = WorkerProcess(wf.app_ref, bootstrap, log_path=tmp_path / "zombie.log",
                           env={**env, "STREAMSCHED_LEDGER_LATENCY_S": "3",
                                "STREAMSCHED_STORE_DIR": str(tmp_path / "zombie")}).start()

    async def claimed() -> bool:
        history = await claim_history(bootstrap, wf)
        return any(s.status is ClaimStatus.CLAIMED for h in history.values() for s in h)

    await wait_for(claimed, timeout=60, interval=0.05, what="the first worker's claims")
    zombie.signal(signal.SIGSTOP)  # in its external call: claims durable, the ledger untouched
    fast = WorkerProcess(wf.app_ref, bootstrap, log_path=tmp_path / "fast.log",
                         env={**env, **skewed_env(AHEAD), "STREAMSCHED_STORE_DIR": str(tmp_path / "fast")})
    try:
        assert accepted_calls(wf) == {}
        fast.start()
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=60 + duration_s)
        zombie.signal(signal.SIGCONT)

        async def zombie_fenced() -> bool:
            return "fenced out of" in (tmp_path / "zombie.log").read_text(errors="replace")

        await wait_for(zombie_fenced, timeout=30, what="the resumed worker to be fenced")
    finally:
        zombie.signal(signal.SIGCONT)
        zombie.kill()
        if fast.alive():
            assert fast.terminate() == 0, fast.log_tail()

    history = await claim_history(bootstrap, wf)
    dead, live = f"-{zombie.pid}-", f"-{fast.pid}-"
    taken = takeovers(history)
    assert taken and all(dead in a and live in b for a, b in taken), taken
    assert early_takeovers(history, {live: AHEAD}, duration_s) == []
    assert final_counters(tmp_path / "fast.log").get("lease_waits", 0) > 0, "the fast clock did not wait"
    # Each identity: one accepted fence (the successor's); the paused worker's call was refused.
    accepted: dict[str, set[int]] = defaultdict(set)
    for key, fence, ok in Ledger(wf.ledger).calls():
        if ok:
            accepted[key].add(fence)
    assert all(len(f) == 1 for f in accepted.values()), accepted
    assert await reexecuted(bootstrap, wf) == {}
    result = await audit(bootstrap, wf, events)
    assert result.effects == result.unique == 12 and result.extra_effects == 0, result
    assert result.fences_ok and result.all_released, result
    judge_logs(logs_of(tmp_path, "zombie", "fast"), restarts=PAUSED_ZOMBIE_RESTARTS, owners_only=True)


async def test_tickers_five_minutes_apart_fire_each_occurrence_once(bootstrap: str, tmp_path: Path) -> None:
    names = [f"s{i}" for i in range(6)]
    catalog = Catalog(bootstrap, f"skew-{uuid.uuid4().hex[:8]}", partitions=4)
    await catalog.ensure_topics()
    target = f"occ-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(target, 2)])
    for name in names:
        # 12 s: the fast ticker's catch-up of about 600 s (50 boundaries) stays well within
        # MAX_CATCH_UP (64), so every boundary fires and none is skipped by policy.
        await catalog.schedule(name, "@every 12s", target)
    env = dict(kit.FAST_FAILOVER_ENV)

    def ticker(name: str, offset: int | None) -> WorkerProcess:
        clock = skewed_env(offset) if offset is not None else {}
        return WorkerProcess("", bootstrap, env={**env, **clock}, log_path=tmp_path / f"{name}.log",
                             command=["schedule", "tick", "--catalog", catalog.name, "--partitions", "4"])

    async def fired_at_least(n: int, *, every: bool = True) -> bool:
        states = await catalog.states()
        counts = [s.fired for s in states.values()]
        return len(counts) == len(names) and (all if every else any)(c >= n for c in counts)

    slow = ticker("slow", BEHIND).start()  # first: every schedule anchored at its clock
    fast = normal = None
    try:
        await wait_for(lambda: fired_at_least(1), timeout=60, what="the slow ticker firing")
        fast = ticker("fast", AHEAD).start()  # some partitions move to it: it catches up 10 minutes
        await wait_for(lambda: fired_at_least(40, every=False), timeout=60,
                       what="the fast ticker catching up")
        slow.kill()  # the rest move to the fast ticker too
        await wait_for(lambda: fired_at_least(40), timeout=60, what="the fast ticker firing everything")
        normal = ticker("normal", None).start()  # takes some over: behind their next boundary, it waits
        await asyncio.sleep(10)
    finally:
        if slow.alive():
            slow.kill()  # the scenario failed before it was killed: never leave it running
        codes = {p.log_path: p.terminate() for p in (fast, normal) if p is not None and p.alive()}
    assert set(codes.values()) <= {0}, codes

    per: dict[str, list[int]] = defaultdict(list)
    for rec in await read_topic(bootstrap, target):
        sid, planned = decode_transition(rec.value).event_id.rsplit("/", 1)
        per[sid].append(int(planned))
    assert sorted(per) == [f"{n}.v1" for n in names]
    states = await catalog.states()
    for sid, times in per.items():
        assert len(times) == len(set(times)), f"{sid} fired an occurrence twice"
        ordered = sorted(times)
        assert ordered == list(range(ordered[0], ordered[-1] + 1, 12 * 10**9)), f"{sid} skipped a boundary"
        assert states[sid.split(".v")[0]].fired == len(times)
        assert states[sid.split(".v")[0]].skipped == 0
        # Fired by both clocks: from the slow ticker's now to the fast one's, ten minutes apart.
        assert ordered[-1] - ordered[0] >= 500 * 10**9, (sid, len(times))
    logs = logs_of(tmp_path, "slow", "fast", "normal")
    assert "Traceback" not in "".join(logs.values())
    judge_logs(logs, restarts=SKEWED_TICKERS_RESTARTS, owners_only=True)
