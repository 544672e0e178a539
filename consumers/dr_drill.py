"""A cross-cluster failover drill: the reference workflow ``due_runs`` on a primary cluster A,
mirrored by a real MirrorMaker 2 to a secondary cluster B, A lost abruptly mid-load, failover to
B with the documented commands, and a black-box audit (used by ``bench/failover_dr.py`` and the
fault matrix's DR test).

Steps (:func:`run_drill`):

1. two independent single-node clusters; the workflow's topics applied on A, then on B with
   ``streamsched topics apply --source-bootstrap A`` (same partitions and settings);
2. ``streamsched dr mirror`` (a real MirrorMaker 2, a child process) mirrors them, and the group;
3. a worker process on A (its command calls the SQLite ledger ``ledger-A``), a steady load of
   new identities produced to A; ``streamsched dr status`` sampled while it runs;
4. the kill: A's broker and worker SIGKILLed together, the mirror stopped; B's copy is read
   (what reached B at the kill);
5. failover: ``streamsched dr failover`` on B, a worker started against B (ledger ``ledger-B``);
   the producing services re-send the events B never got (as an outbox would) and go on
   producing to B; the drill waits until every identity on B has an outcome there.

The audit counts calls in the two ledgers (the external command's own record), never worker
memory: see :class:`DrillReport` for each figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from consumers.harness import FAST_FAILOVER_ENV, Workflow, ledger_calls
from streamsched.kafka.producer import Producer
from streamsched.kafka.reads import read_topic
from streamsched.model.claims import ClaimState, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.ops.broker import LocalCluster, stop_pid_file
from streamsched.testing import WorkerProcess, make_event, produce_events, wait_for
from streamsched.wire.claim import CLAIM_CODEC
from streamsched.wire.transition import decode_transition

PARTITIONS = 4
WORKER_ENV = {**FAST_FAILOVER_ENV, "STREAMSCHED_LEDGER_LATENCY_S": "0.05",
              "STREAMSCHED_COMMIT_INTERVAL": "0s"}


@dataclass
class DrillReport:
    """What the drill measured (the benchmark prints these keys)."""

    produced: int = 0
    """Identities the primary acknowledged before the kill."""
    lost: int = 0
    """Identities acknowledged by either cluster, or on B, with no SUCCEEDED outcome on B after
    the drain: work lost by the failover (target 0)."""
    dup_outside_unmirrored: int = 0
    """Identities called more than once other than once on each cluster with their outcome not
    on B at the kill: twice on one cluster, or after their outcome had been mirrored (target 0)."""
    dup_unmirrored: int = 0
    """Identities called once on each cluster whose outcome had not reached B at the kill."""
    unmirrored_outcomes_at_kill: int = 0
    """Identities called on A whose outcome was not on B at the kill (the bound on duplicates)."""
    unmirrored_events_at_kill: int = 0
    """Identities A acknowledged whose event was not on B at the kill (the mirror's loss; the
    producing services re-send them)."""
    mirror_lag_s: float = 0.0
    """Age at the kill of the oldest acknowledged event that had not reached B."""
    rto_s: float = 0.0
    """From the kill to the first call made by B's worker (failover commands included)."""
    status_behind_s: float | None = None
    """``dr status``'s largest ``behind_s`` sampled under load before the kill."""
    keys_consistent: bool = True
    """Every call carried its identity's idempotency key (one key per identity, on both sides)."""
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cli(*args: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "streamsched", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"streamsched {' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


async def _outcomes(conn: str, wf: Workflow) -> dict[str, ClaimState]:
    """The latest state of each identity on ``conn`` that carries an outcome."""
    latest: dict[str, ClaimState] = {}
    for rec in await read_topic(conn, wf.state_topic):
        if rec.value is not None:
            st = ClaimState.from_record(CLAIM_CODEC.decode(rec.value))
            latest[st.identity] = st
    return {i: st for i, st in latest.items() if st.outcome is not None}


async def _events(conn: str, wf: Workflow) -> set[str]:
    out = set()
    for rec in await read_topic(conn, wf.topic):
        out.add(wf.identity(decode_transition(rec.value)))
    return out


class Load:
    """New identities produced in batches: to A until the kill, then (re-pointed) to B."""

    def __init__(self, wf: Workflow, *, rate: float) -> None:
        self.wf, self.rate, self.seq = wf, rate, 0
        self.acked: dict[str, int] = {}
        """Identity -> produce time (ns) of events a cluster acknowledged."""
        self.events: dict[str, TransitionEvent] = {}
        self.failed: list[TransitionEvent] = []
        self.inflight: list[TransitionEvent] = []

    def batch(self, n: int) -> list[TransitionEvent]:
        out = []
        for _ in range(n):
            self.seq += 1
            ev = make_event("due", f"tenant-{self.seq % 5}", [f"dr-{self.seq}"],
                            due_ns=1_700_000_000 * 10**9 + self.seq)
            self.events[self.wf.identity(ev)] = ev
            out.append(ev)
        return out

    async def run(self, conn: str, stop: asyncio.Event, *, size: int = 4) -> None:
        async with Producer(conn, linger_ms=5) as producer:
            while not stop.is_set():
                self.inflight = self.batch(size)
                await producer.send_many(self.wf.topic, self.inflight)
                for ev in self.inflight:
                    self.acked[self.wf.identity(ev)] = ev.produced_ns
                self.inflight = []
                await asyncio.sleep(size / self.rate)

    async def cut(self, task: asyncio.Task[None]) -> None:
        """The cluster died under the load: whatever was in flight was never acknowledged (the
        producing service re-sends it to B)."""
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 15)
        self.failed.extend(self.inflight)
        self.inflight = []


async def run_drill(tmp: Path, *, rate: float = 20.0, load_s: float = 15.0, after_s: float = 10.0,
                    mirror_wait_ms: int = 1500, log: Callable[[str], None] = lambda _: None) -> DrillReport:
    """Run the drill in ``tmp``. ``mirror_wait_ms``: how long the mirror's fetches wait for data
    (with a 1 MiB minimum, each waits the whole time): a mirror that lags like one across regions,
    so the kill leaves outcomes and events on A that B never got."""
    report = DrillReport()
    # The load's producer retries a dead primary until it is cancelled: one line per retry.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    wf_a = Workflow("due_runs", f".dr-{uuid.uuid4().hex[:6]}", tmp / "ledger-A.sqlite3")
    wf_b = Workflow("due_runs", wf_a.namespace, tmp / "ledger-B.sqlite3")
    env = wf_a.env
    (tmp / "topics").mkdir(parents=True, exist_ok=True)
    (tmp / "topics" / "runs.toml").write_text(
        f'[[topic]]\nname = "{wf_a.topic}"\npartitions = {PARTITIONS}\nkind = "transition"\n')
    scope = ["--dir", str(tmp / "topics"), "--app", wf_a.app_ref]
    a, b = LocalCluster(tmp / "A", heap="-Xmx384m"), LocalCluster(tmp / "B", heap="-Xmx384m")
    workers: list[WorkerProcess] = []
    mm: subprocess.Popen[bytes] | None = None
    t0 = time.monotonic()
    try:
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
        _cli("topics", "apply", "--bootstrap", a.bootstrap, *scope, env=env)
        _cli("topics", "apply", "--bootstrap", b.bootstrap, "--source-bootstrap", a.bootstrap, *scope,
             env=env)
        report.timings["clusters_s"] = time.monotonic() - t0
        slow = ["--mirror-option", f"primary.consumer.fetch.max.wait.ms={mirror_wait_ms}",
                "--mirror-option", f"primary.consumer.fetch.min.bytes={1 << 20}"] if mirror_wait_ms else []
        with open(tmp / "dr-mirror.log", "ab") as out:
            mm = subprocess.Popen([sys.executable, "-m", "streamsched", "dr", "mirror", "--bootstrap",
                                   b.bootstrap, "--source-bootstrap", a.bootstrap, *scope, *slow,
                                   "--replication", "1", "--workdir", str(tmp / "mirror")],
                                  env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        workers.append(WorkerProcess(wf_a.app_ref, a.bootstrap, env={**WORKER_ENV, **wf_a.env},
                                     log_path=tmp / "worker-A.log").start())
        load = Load(wf_a, rate=rate)
        stop = asyncio.Event()
        feeder = asyncio.create_task(load.run(a.bootstrap, stop))

        async def mirrored() -> bool:
            return bool(await _outcomes(b.bootstrap, wf_a))

        await wait_for(mirrored, timeout=120, interval=1.0, what="outcomes mirrored to B")
        log(f"mirror flowing after {time.monotonic() - t0:.1f}s")
        samples = []
        until = time.monotonic() + load_s
        while time.monotonic() < until:  # the load goes on meanwhile (the CLI runs in a thread)
            out = await asyncio.to_thread(_cli, "dr", "status", "--bootstrap", b.bootstrap,
                                          "--source-bootstrap", a.bootstrap, *scope, "--json", env=env)
            samples.append(json.loads(out)["behind_s"])
            await asyncio.sleep(2.0)
        report.status_behind_s = max((s for s in samples if s is not None), default=None)

        # --- the kill: the primary region is gone (broker and worker), the mirror stops --------
        kill_ns = time.time_ns()
        for node in list(a.procs):
            a.kill_node(node, signal.SIGKILL)
        for w in workers:
            w.kill()
        await load.cut(feeder)
        _stop(mm)
        report.produced = len(load.acked)
        at_kill_events = await _events(b.bootstrap, wf_a)
        at_kill_outcomes = set(await _outcomes(b.bootstrap, wf_a))
        called_a = Counter(c.key for c in ledger_calls(wf_a.ledger))
        unmirrored_events = set(load.acked) - at_kill_events
        unmirrored_outcomes = set(called_a) - at_kill_outcomes
        report.unmirrored_events_at_kill = len(unmirrored_events)
        report.unmirrored_outcomes_at_kill = len(unmirrored_outcomes)
        report.mirror_lag_s = max(((kill_ns - load.acked[i]) / 1e9 for i in unmirrored_events), default=0.0)
        log(f"killed A: {report.produced} acknowledged, {len(unmirrored_events)} events and "
            f"{len(unmirrored_outcomes)} outcomes not on B")

        # --- failover: the documented commands, then workers against B ---------------------------
        _cli("dr", "failover", "--bootstrap", b.bootstrap, *scope, "--json", env=env)
        workers.append(WorkerProcess(wf_b.app_ref, b.bootstrap, env={**WORKER_ENV, **wf_b.env},
                                     log_path=tmp / "worker-B.log").start())
        resend = [load.events[i] for i in sorted(unmirrored_events)] + load.failed
        await produce_events(b.bootstrap, wf_a.topic, resend)
        for ev in load.failed:
            load.acked[wf_a.identity(ev)] = ev.produced_ns
        stop_b = asyncio.Event()
        feeder_b = asyncio.create_task(load.run(b.bootstrap, stop_b))

        async def b_called() -> bool:
            return bool(ledger_calls(wf_b.ledger))

        await wait_for(b_called, timeout=120, interval=0.2, what="B's first call")
        first_b = min(c.at_ns or 0 for c in ledger_calls(wf_b.ledger))
        report.rto_s = (first_b - kill_ns) / 1e9
        log(f"B executing {report.rto_s:.1f}s after the kill")
        await asyncio.sleep(after_s)  # the load goes on against B
        stop_b.set()
        await feeder_b

        async def drained() -> bool:
            return await _events(b.bootstrap, wf_a) <= set(await _outcomes(b.bootstrap, wf_a))

        await wait_for(drained, timeout=180, interval=1.0, what="every identity on B has an outcome on B")
        on_b = await _events(b.bootstrap, wf_a)
        done_b = await _outcomes(b.bootstrap, wf_a)
        called_b = Counter(c.key for c in ledger_calls(wf_b.ledger))
        # Every identity acknowledged anywhere (A before the kill, B after, re-sent ones) or on B
        # must have a SUCCEEDED outcome on B: an event that never reached B was re-sent to it.
        wanted = set(load.acked) | on_b
        report.lost = len([i for i in wanted if (st := done_b.get(i)) is None or st.outcome is None
                           or st.outcome.kind is not OutcomeKind.SUCCEEDED])
        calls = called_a + called_b
        # Allowed twice: once on A and once on B, for an identity whose outcome had not reached B
        # at the kill. Anything else called more than once (twice on one cluster, three times,
        # or twice with its outcome on B) is a duplicate outside that set.
        allowed = {i for i in unmirrored_outcomes if called_a[i] == 1 and called_b[i] == 1}
        dups = {i for i, n in calls.items() if n > 1}
        report.dup_unmirrored = len(dups & allowed)
        report.dup_outside_unmirrored = len(dups - allowed)
        report.keys_consistent = set(calls) <= set(load.events)
        report.timings["total_s"] = time.monotonic() - t0
        return report
    finally:
        for w in workers:
            if w.alive():
                w.kill()
        if mm is not None:
            _stop(mm, timeout=5)
            stop_pid_file(tmp / "mirror" / "mirror.pid", timeout=5)  # MirrorMaker, if it outlived it
        for cluster in (a, b):
            for node in list(cluster.procs):
                cluster.kill_node(node, signal.SIGKILL)


def _stop(proc: subprocess.Popen[bytes], *, timeout: float = 30.0) -> None:
    """SIGTERM ``dr mirror`` (it stops MirrorMaker and exits), SIGKILL past ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
