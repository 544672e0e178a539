"""Soak benchmark: 90 minutes of steady load and rotating faults on a 3-node cluster, then an audit.

Setup, reused from bench/failover.py and the fault matrix (tests/faults/fault_harness.py): a local
three-node KRaft cluster (:class:`~streamsched.ops.broker.LocalCluster`, replication 3,
``min.insync.replicas`` 2), one transition topic of ``--partitions`` partitions (RF 3; the workers
create their state, delay and dead-letter topics RF 3), and ``--workers`` worker processes
(``streamsched run``, :class:`~streamsched.testing.WorkerProcess`) of the reference app
``consumers.due_runs``, whose external command writes the SQLite ledger (50 ms per call) with the
fault matrix's worker settings (``WORKER_ENV``: 3 s sessions) but the app's own claim lease of 30 s
(``--claim-s``): with the fault matrix's 5 s, a burst on this shared machine queued ledger writes
(SQLite's lock, three processes) past their lease, and such a late call lands before the next
owner's, so the audit rightly counts it (``calls_after_lease``). Claims on disk (RocksDB) under the
run's data directory.

Load: this script sends ``due`` events at a steady rate (a batch every 100 ms, one producer; a
failed batch is sent again, which the identities make safe), about ``--dup-ratio`` (25 %) of them
copies of events already sent (half of the last 2,000, half from the whole run), so dedup runs
against claims in flight, fresh outcomes and old ones in the store. The rate, unless ``--rate``
is given: after a warm-up (every worker in the group, every partition executing), a burst of
``--probe-events`` new identities is sent at once and the time until the ledger has executed them
all gives the maximum (``probe.max_rate_per_s``); the soak runs at half of it, but at most at the
rate whose identities the final audit can read (it reads whole topics, bounded at 1M records by
consumers.harness, two state snapshots per identity: :data:`AUDIT_IDENTITIES` over the run).

Faults, the first at half an interval, then every ``--fault-every`` minutes, in turn:

broker_kill   ``kill -9`` of the node coordinating the workers' group, restarted after ``--down-s``
broker_pause  SIGSTOP of that node for ``--pause-s``, then SIGCONT
worker_kill   SIGKILL of the churn worker (the last one), started again at once
worker_term   SIGTERM of the churn worker (a graceful leave, a rebalance), started again

After each, the fault waits (``--recover-s`` at most) until every replica of the workflow's topics,
``__consumer_offsets`` and ``__transaction_state`` is in sync and exactly the live workers are the
group's members. Network, clock and disk faults need root and namespaces: not here (the fault
matrix runs them). Only the churn worker is killed, so the others live the whole run and their
memory can be judged.

Every minute one JSON line: produced events and identities, executed identities (the ledger's
effects), the group's lag (transition and delay topics, :func:`streamsched.kafka.reads.group_lag`),
the p50/p99 of produce-to-execution latency of what executed that minute (the effect's ledger time
minus the event's creation just before it was sent; same clock), per worker its pid, RSS
(``/proc/<pid>/status`` VmRSS) and open file descriptors (``/proc/<pid>/fd``), the brokers' RSS,
the faults started that minute. At the end: the load stops, lag must reach 0 (``--drain-s``), the
workers get SIGTERM, and the audit runs (consumers.harness.audit plus the fault matrix's
``FaultAudit``: Kafka read_committed and the ledger). The last line is the summary, one JSON object;
``pass`` is false, with ``reasons``, and the exit status 1 when

* a long-lived worker's memory did not level off (judged by :mod:`bench.soak_memory` on each
  worker process alive from minute 20 of 90 to the end, scaled for shorter runs): its RSS at the
  end more than 5 % from its RSS at the middle minute, or its RSS minus what the claim stores'
  bounded caches report (``store_memory_bytes``) more than 5 % from that minute's value at any
  later minute. ``--store-cache-bytes`` and ``--block-cache-bytes`` shrink the decoded-claim
  caches and RocksDB's block cache so they fill early;
  ``--tracemalloc-at`` has the long-lived workers write allocation snapshots and reports what
  grew between them by source line (a diagnostic: tracing costs memory of its own);
* an identity sent was never executed (lost);
* an identity was executed twice: called again after its outcome was stored, or after its lease
  had expired and a later claim took it over; or any other audit flag (fences not rising, an
  outcome without its call, an offset committed ahead of its outcome, an identity not released);
* lag did not reach 0, a worker exited on its own, or events could not be sent at all.

Progress goes to stderr. Not part of ``make test``.

Usage: ``python bench/soak.py [--minutes 90] [--fault-every 4.5] [--rate N] [--workers 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import soak_memory  # noqa: E402
from bench.failover import (  # noqa: E402
    Load,
    executions_since,
    in_sync,
    load_avg,
    roles,
    wait_until,
    wait_until_async,
)
from consumers.harness import Workflow, claim_history, ledger_calls, unresolved_below_commit  # noqa: E402
from consumers.harness import audit as harness_audit  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.kafka.reads import group_lag  # noqa: E402
from streamsched.model.event import TransitionEvent  # noqa: E402
from streamsched.model.names import internal_topic  # noqa: E402
from streamsched.ops.broker import DEFAULT_HEAP, LocalCluster, free_port  # noqa: E402
from streamsched.testing import WorkerProcess, make_event, wait_drained  # noqa: E402
from tests.faults.fault_audit import FaultAudit, calls_after_lease, unexpected_log_lines  # noqa: E402
from tests.faults.fault_harness import WORKER_ENV  # noqa: E402
from tests.faults.skew_disk_support import members_are  # noqa: E402

FAULTS = ("broker_kill", "broker_pause", "worker_kill", "worker_term")
AUDIT_IDENTITIES = 350_000
"""The most identities the soak sends: the audit reads the state topic whole (two snapshots per
identity, more after retries) through reads bounded at 1M records."""
WARMUP_RATE = 20.0
ADMIN_TIMEOUT_S = 20.0
"""Bound of each admin call of this script (lag, roles, members): a paused broker costs a sample."""


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def proc_stats(pid: int) -> dict[str, Any] | None:
    """RSS (MB) and open file descriptors of a live process, from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None
    return {"pid": pid, "rss_mb": round(rss_kb / 1024, 1), "fds": fds}


STORE_MEMORY = re.compile(r'^streamsched_store_memory_bytes\{[^}]*kind="(\w+)"[^}]*\} (\S+)$', re.M)


def store_memory_mb(port: int) -> dict[str, float] | None:
    """The worker's claim-store memory (MB by kind: RocksDB block cache and memtables, decoded
    snapshots), from its /metrics; None if it does not answer (restarting, or paused with a
    broker)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {kind: round(float(v) / 2**20, 1) for kind, v in STORE_MEMORY.findall(text)}


def quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None


@dataclass
class SoakLoad(Load):
    """bench/failover.py's load with duplicates, and failed batches sent again until they go."""

    dup_ratio: float = 0.25
    events: list[TransitionEvent] = field(default_factory=list)
    """Every event sent (acknowledged), duplicates included: what the audit expects."""
    sent_ids: set[str] = field(default_factory=set)
    duplicates: int = 0
    in_flight: int = 0
    unsent: list[TransitionEvent] = field(default_factory=list)
    """Batches given up when the load stopped (possibly written in part)."""
    closing: bool = False
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def fresh(self, n: int) -> list[Any]:
        return super().batch(n)

    def batch(self, n: int) -> list[Any]:
        copies = sum(self.rng.random() < self.dup_ratio for _ in range(n)) if self.events else 0
        events = self.fresh(n - copies)
        for _ in range(copies):
            pool = self.events[-2000:] if self.rng.random() < 0.5 else self.events
            src = self.rng.choice(pool)
            events.append(make_event(src.type, src.tenant, src.target, due_ns=src.due_ns))
        self.rng.shuffle(events)
        return events

    async def send(self, producer: Producer, events: list[Any]) -> None:
        self.in_flight += 1
        try:
            while True:
                if self.closing:
                    self.unsent.extend(events)
                    return
                try:
                    await producer.send_many(self.wf.topic, events)
                except Exception as exc:  # noqa: BLE001 - a fault fails a send; sent again (safe)
                    self.failed += len(events)
                    log(f"load: a send failed, sending it again: {exc!r}")
                    await asyncio.sleep(1)  # a retry's backoff, not a wait for a condition
                    continue
                self.sent += len(events)
                self.events.extend(events)
                for ev in events:
                    if ev.target[0] in self.sent_ids:
                        self.duplicates += 1
                    self.sent_ids.add(ev.target[0])
                return
        finally:
            self.in_flight -= 1

    async def run(self, stop: asyncio.Event, *, drain_s: float = 30.0) -> None:
        try:
            await super().run(stop, drain_s=drain_s)
        finally:
            self.closing = True

    def reopen(self) -> None:
        self.closing = False


@dataclass
class Slot:
    """One worker's place: the process in it now and how often it was started."""

    name: str
    proc: WorkerProcess
    starts: int = 1


class Soak:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster, workdir: Path) -> None:
        self.args, self.cluster, self.workdir = args, cluster, workdir
        self.wf = Workflow("due_runs", f".soak-{uuid.uuid4().hex[:6]}", workdir / "ledger.sqlite3")
        self.delay = internal_topic("delay", self.wf.name)
        self.env = {**WORKER_ENV, **self.wf.env, "STREAMSCHED_STORE_DIR": str(workdir / "stores"),
                    "STREAMSCHED_CLAIM_DURATION_S": str(args.claim_s)}
        if args.store_cache_bytes is not None:
            self.env["STREAMSCHED_STORE_CACHE_BYTES"] = str(args.store_cache_bytes)
        if args.block_cache_bytes is not None:
            self.env["STREAMSCHED_STORE_BLOCK_CACHE_BYTES"] = str(args.block_cache_bytes)
        self.snapshots = (soak_memory.Snapshots(workdir / "tracemalloc", [*args.tracemalloc_at, args.minutes])
                          if args.tracemalloc_at else None)
        if self.snapshots:
            self.env.update(self.snapshots.env())
        self.load = SoakLoad(cluster.bootstrap, self.wf, args.partitions, WARMUP_RATE,
                             dup_ratio=args.dup_ratio)
        self.slots: list[Slot] = []
        self.ports: dict[str, int] = {}
        self.faulting: set[str] = set()
        self.faults: list[dict[str, Any]] = []
        self.reasons: list[str] = []
        self.warnings: list[str] = []
        self.executed: dict[str, int] = {}
        self.read_ns = 0
        self.latencies: list[float] = []
        self.samples: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.sent0 = 0

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def start_worker(self, name: str) -> WorkerProcess:
        port = self.ports.setdefault(name, free_port())  # a restarted worker serves on the same one
        env = {**self.env, "STREAMSCHED_STATUS_PORT": str(port)}
        return WorkerProcess(self.wf.app_ref, self.bootstrap, env=env,
                             log_path=self.workdir / f"{name}.log", cwd=ROOT).start()

    def restart(self, slot: Slot) -> None:
        slot.proc = self.start_worker(slot.name)
        slot.starts += 1

    def minute(self) -> float:
        return round((time.time() - self.t0) / 60, 2)

    # --- health -----------------------------------------------------------------------------------

    async def members_ok(self) -> bool:
        try:
            return await asyncio.wait_for(
                members_are(self.bootstrap, self.wf.group, *[s.proc for s in self.slots]), ADMIN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - not answering (a paused coordinator) is not healthy
            return False

    async def replicas_ok(self) -> bool:
        topics = [self.wf.topic, self.wf.state_topic, self.delay, "__consumer_offsets", "__transaction_state"]
        return await in_sync(self.bootstrap, topics)

    async def healthy(self) -> bool:
        return await self.replicas_ok() and await self.members_ok()

    async def lag(self) -> tuple[int, int] | None:
        """The group's lag on the transition topic and on the delay topic (work parked there)."""
        try:
            transitions, delay = [(await asyncio.wait_for(group_lag(self.bootstrap, self.wf.group, topic),
                                                   ADMIN_TIMEOUT_S)).total
                           for topic in (self.wf.topic, self.delay)]
        except Exception:  # noqa: BLE001 - a sample during a fault may not get an answer
            return None
        return transitions, delay

    def check_workers(self) -> None:
        """A worker that exited on its own (not in a fault) fails the soak; it is started again."""
        for slot in self.slots:
            if slot.name not in self.faulting and not slot.proc.alive():
                code = slot.proc.proc.returncode if slot.proc.proc else None
                self.reasons.append(f"{slot.name} (pid {slot.proc.pid}) exited on its own with code {code} "
                                    f"at minute {self.minute()}")
                log(f"{slot.name} exited on its own ({code}); log tail:\n{slot.proc.log_tail(30)}")
                self.restart(slot)

    # --- setup ------------------------------------------------------------------------------------

    async def setup(self) -> None:
        await apply(self.bootstrap, [TopicSpec(self.wf.topic, self.args.partitions, replication=3)])
        names = [f"w{i}" for i in range(self.args.workers)]
        self.slots = [Slot(name, self.start_worker(name)) for name in names]
        # Warm-up: a low load until exactly these workers are the group and every partition executes.
        stop = asyncio.Event()
        task = asyncio.create_task(self.load.run(stop))
        try:
            ok = await wait_until_async(self.members_ok, 240, "every worker in the group")
            since = time.time()
            ok = ok and await wait_until(lambda: len({
                self.load.partition_of.get(r) for r, _ in executions_since(self.wf.ledger, int(since * 1e9))
                if self.load.created.get(r, 0.0) > since}) >= self.args.partitions, 180,
                "every partition to execute")
        finally:
            stop.set()
            await task
        if not ok:
            raise SystemExit("warm-up failed; worker log tail:\n" + self.slots[0].proc.log_tail(40))
        await wait_drained(self.bootstrap, self.wf.group, self.wf.topic, timeout=180)
        self.load.reopen()

    async def probe(self) -> dict[str, Any]:
        """The maximum rate: a burst of new identities sent at once, timed until all executed."""
        n: int = self.args.probe_events
        events = self.load.fresh(n)
        ids = {ev.target[0] for ev in events}
        started = time.time()
        async with Producer(self.bootstrap, linger_ms=5) as producer:
            await self.load.send(producer, events)
        done: dict[str, int] = {}

        def all_executed() -> bool:
            done.update((r, at) for r, at in executions_since(self.wf.ledger, int(started * 1e9)) if r in ids)
            return len(done) >= n

        if not await wait_until(all_executed, 600, "the probe's burst to execute"):
            raise SystemExit(f"the probe's {n} events did not all execute within 600 s")
        seconds = max(done.values()) / 1e9 - started
        await wait_drained(self.bootstrap, self.wf.group, self.wf.topic, timeout=180)
        return {"events": n, "seconds": round(seconds, 2), "max_rate_per_s": round(n / seconds, 1)}

    def choose_rate(self, probe: dict[str, Any] | None) -> tuple[float, str]:
        cap = AUDIT_IDENTITIES / (self.args.minutes * 60 * (1 - self.args.dup_ratio))
        if self.args.rate:
            if self.args.rate > cap:
                self.warnings.append(f"--rate {self.args.rate} sends more identities than the audit reads "
                                     f"(about {cap:.0f}/s for this run): it may end in BoundExceeded")
            return self.args.rate, "--rate"
        assert probe is not None
        half = probe["max_rate_per_s"] / 2
        if half > cap:
            return round(cap, 1), (f"audit bound ({AUDIT_IDENTITIES} identities over the run; "
                                   f"half the maximum: {half:.0f}/s)")
        return round(half, 1), "half the probe's maximum"

    # --- faults -----------------------------------------------------------------------------------

    async def fault(self, kind: str) -> None:
        rec: dict[str, Any] = {"kind": kind, "minute": self.minute()}
        self.faults.append(rec)  # at its start: a minute's sample lists the faults begun in it
        started = time.monotonic()
        if kind.startswith("broker"):
            if not await wait_until_async(self.replicas_ok, self.args.recover_s, "replicas in sync"):
                self.warnings.append(f"{kind} at minute {rec['minute']}: replicas not all in sync before it")
            try:
                victim = (await asyncio.wait_for(roles(self.bootstrap, self.wf, self.args.partitions),
                                                 ADMIN_TIMEOUT_S))["group_coordinator"]
            except Exception:  # noqa: BLE001
                victim = 1
            rec["victim"] = f"node {victim}"
            log(f"fault {kind}: node {victim} (group coordinator)")
            if kind == "broker_kill":
                await asyncio.to_thread(self.cluster.kill_node, victim, signal.SIGKILL)
                try:
                    await asyncio.sleep(self.args.down_s)  # the outage's length, not a wait for a state
                finally:
                    self.cluster.start_node(victim)
            else:
                self.cluster.kill_node(victim, signal.SIGSTOP)
                try:
                    await asyncio.sleep(self.args.pause_s)  # the pause's length
                finally:
                    self.cluster.kill_node(victim, signal.SIGCONT)
        else:
            slot = self.slots[-1]
            rec["victim"] = f"{slot.name} (pid {slot.proc.pid})"
            log(f"fault {kind}: {rec['victim']}")
            self.faulting.add(slot.name)
            try:
                if kind == "worker_kill":
                    await asyncio.to_thread(slot.proc.kill)
                else:
                    t = time.monotonic()
                    await slot.proc.signal_when_caught(signal.SIGTERM)
                    try:
                        rec["exit_code"] = await slot.proc.wait_exit(60)
                    except TimeoutError:
                        await asyncio.to_thread(slot.proc.kill)
                        rec["exit_code"] = "killed after 60 s"
                    rec["exit_s"] = round(time.monotonic() - t, 2)
                    if rec["exit_code"] != 0:
                        self.warnings.append(f"{kind} at minute {rec['minute']}: exit {rec['exit_code']}")
                self.restart(slot)
            finally:
                self.faulting.discard(slot.name)
        rec["recovered"] = await wait_until_async(self.healthy, self.args.recover_s,
                                                  f"recovery from {kind} (replicas in sync, group whole)")
        rec["recovered_s"] = round(time.monotonic() - started, 1)
        if not rec["recovered"]:
            self.warnings.append(f"{kind} at minute {rec['minute']}: no recovery in {self.args.recover_s} s")
        log(f"fault {kind}: recovered={rec['recovered']} after {rec['recovered_s']} s")

    async def fault_loop(self) -> None:
        every = self.args.fault_every * 60
        k = 0
        while (at := self.t0 + (k + 0.5) * every) < self.t0 + self.args.minutes * 60:
            await asyncio.sleep(max(0.0, at - time.time()))  # until the fault's time (pacing)
            kind = FAULTS[k % len(FAULTS)]
            try:
                await self.fault(kind)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be made is reported
                self.warnings.append(f"{kind} at minute {self.minute()} failed: {exc!r}")
                log(f"fault {kind} failed: {exc!r}")
            k += 1

    # --- samples ----------------------------------------------------------------------------------

    def take_executions(self) -> list[tuple[str, int]]:
        """Effects not seen before (read with a margin: a row's time precedes its commit)."""
        now_ns = time.time_ns()
        rows = executions_since(self.wf.ledger, self.read_ns - 10 * 10**9)
        self.read_ns = now_ns
        new = [(r, at) for r, at in rows if r not in self.executed]
        self.executed.update(new)
        return new

    async def sample(self, minute: int, prev: dict[str, Any] | None) -> dict[str, Any]:
        self.check_workers()
        new = self.take_executions()
        lat = [at / 1e6 - self.load.created[r] * 1e3 for r, at in new if r in self.load.created]
        self.latencies += lat
        elapsed = time.time() - (prev["at"] if prev else self.t0)
        lag = await self.lag()
        started = [f"{f['kind']}@{f['minute']}" for f in self.faults
                   if f["minute"] > (prev["minute"] if prev else -1)]
        doc = {
            "minute": minute, "at": round(time.time(), 1),
            "produced": self.load.sent, "produced_identities": len(self.load.sent_ids),
            "rate_per_s": round((self.load.sent - (prev["produced"] if prev else self.sent0)) / elapsed, 1),
            "executed": len(self.executed), "executed_this_minute": len(new),
            "lag": sum(lag) if lag else None, "lag_delay_topic": lag[1] if lag else None,
            "latency_p50_ms": quantile(lat, 0.5), "latency_p99_ms": quantile(lat, 0.99),
            "workers": {s.name: await self.worker_stats(s) for s in self.slots},
            "brokers_rss_mb": {n: (proc_stats(p.pid) or {}).get("rss_mb")
                               for n, p in self.cluster.procs.items()},
            "faults": started,
            "load_avg": load_avg(),
        }
        return doc

    async def worker_stats(self, slot: Slot) -> dict[str, Any] | None:
        stats = proc_stats(slot.proc.pid) if slot.proc.alive() else None
        if stats is not None:
            stats["store_mb"] = await asyncio.to_thread(store_memory_mb, self.ports[slot.name])
        return stats

    async def sample_loop(self) -> None:
        prev: dict[str, Any] | None = None
        for minute in range(1, self.args.minutes + 1):
            await asyncio.sleep(max(0.0, self.t0 + minute * 60 - time.time()))  # until the minute
            doc = await self.sample(minute, prev)
            self.samples.append(doc)
            emit(doc)
            prev = doc
            if self.snapshots and self.snapshots.due(minute):  # the long-lived workers only
                self.snapshots.take(minute, [s.proc.pid for s in self.slots[:-1] if s.proc.alive()])

    # --- the run ----------------------------------------------------------------------------------

    def memory_check(self) -> dict[str, Any]:
        """The memory judgement of :mod:`bench.soak_memory`, its reasons added to the run's."""
        names = [slot.name for slot in self.slots]
        figures, reasons = soak_memory.judge(self.samples, names, self.args.minutes)
        self.reasons += reasons
        figures["table"] = soak_memory.table(self.samples, names)
        if self.snapshots:
            figures["tracemalloc_growth"] = self.snapshots.report()
        return figures

    async def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        log(f"setup: cluster at {self.bootstrap}; warm-up")
        await self.setup()
        probe = None if self.args.rate else await self.probe()
        rate, why = self.choose_rate(probe)
        log(f"probe {probe}; soak at {rate}/s ({why}) for {self.args.minutes} min")
        self.load.rate = rate
        self.t0, self.read_ns, self.sent0 = time.time(), time.time_ns(), self.load.sent
        self.executed.update(executions_since(self.wf.ledger, 0))
        stop = asyncio.Event()
        load_task = asyncio.create_task(self.load.run(stop, drain_s=self.args.drain_s))
        fault_task = asyncio.create_task(self.fault_loop())
        try:
            await self.sample_loop()
        finally:
            stop.set()
            await load_task
        await fault_task  # one still running finishes (its waits have deadlines)
        await wait_until(lambda: self.load.in_flight == 0, 30, "the last sends to settle")
        self.check_workers()
        if self.load.unsent:
            self.reasons.append(f"{len(self.load.unsent)} events not sent within {self.args.drain_s} s")
        t = time.monotonic()
        try:
            await wait_drained(self.bootstrap, self.wf.group, self.wf.topic, timeout=self.args.drain_s)
            result["drain_s"] = round(time.monotonic() - t, 1)
        except TimeoutError:
            self.reasons.append(f"lag not 0 within {self.args.drain_s} s after the load stopped "
                                f"(lag {await self.lag()})")
        new = self.take_executions()
        self.latencies += [at / 1e6 - self.load.created[r] * 1e3 for r, at in new if r in self.load.created]
        result["shutdown_exit_codes"] = await self.stop_workers()
        log("audit")
        audit = await self.audit()
        result.update(self.audit_summary(audit))
        result.update(probe=probe, rate_per_s=rate, rate_chosen_by=why, memory=self.memory_check())
        lines = self.log_findings()
        result.update(unexpected_log_lines=len(lines), unexpected_log_samples=lines[:5])
        soaked = self.samples[-1]["produced"] - self.sent0 if self.samples else 0
        result.update(achieved_rate_per_s=round(soaked / (self.args.minutes * 60), 1))
        result.update(faults=self.faults, worker_starts={s.name: s.starts for s in self.slots},
                      produced_events=self.load.sent, produced_identities=len(self.load.sent_ids),
                      duplicates_sent=self.load.duplicates, send_failures=self.load.failed,
                      executed_identities=len(self.executed),
                      latency_ms={"p50": quantile(self.latencies, 0.5), "p99": quantile(self.latencies, 0.99),
                                  "max": quantile(self.latencies, 1.0)},
                      max_lag=max((s["lag"] or 0 for s in self.samples), default=None))
        return result

    async def stop_workers(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for slot in self.slots:
            try:
                await slot.proc.signal_when_caught(signal.SIGTERM)
                codes[slot.name] = await slot.proc.wait_exit(60)
            except TimeoutError:
                slot.proc.kill()
                codes[slot.name] = None
        return codes

    async def audit(self) -> FaultAudit:
        """consumers.harness.audit and the fault matrix's additions, as tests/faults audits."""
        history = await claim_history(self.bootstrap, self.wf)
        return FaultAudit(await harness_audit(self.bootstrap, self.wf, self.load.events),
                          calls_after_lease(ledger_calls(self.wf.ledger), history),
                          await unresolved_below_commit(self.bootstrap, self.wf))

    def audit_summary(self, fa: FaultAudit) -> dict[str, Any]:
        b = fa.base
        if b.missing:
            self.reasons.append(f"lost: {b.missing} of {b.unique} identities never executed")
        if b.reexecuted:
            self.reasons.append(f"executed twice: {len(b.reexecuted)} identities called again after their "
                                f"outcome was stored (e.g. {list(b.reexecuted[:3])})")
        if b.extra_effects:
            self.reasons.append(f"{b.extra_effects} effects beyond one per identity sent")
        if fa.calls_after_lease:
            self.reasons.append(f"executed after its lease expired: {len(fa.calls_after_lease)} identities "
                                f"(e.g. {fa.calls_after_lease[:3]})")
        for bad, what in ((not b.fences_ok, "fences did not rise strictly"),
                          (not b.all_released, "not every identity ended released with its outcome"),
                          (bool(b.unbacked), f"{len(b.unbacked)} stored successes without their call"),
                          (bool(fa.unresolved_below_commit),
                           f"{len(fa.unresolved_below_commit)} offsets committed ahead of their outcome")):
            if bad:
                self.reasons.append(what)
        return {"audit": {"ok": fa.ok, "events": b.events, "unique": b.unique, "effects": b.effects,
                          "missing": b.missing, "duplicates_suppressed": b.duplicates_suppressed,
                          "calls": b.calls, "retried": b.retried, "reexecuted": len(b.reexecuted),
                          "extra_effects": b.extra_effects, "calls_after_lease": len(fa.calls_after_lease),
                          "unbacked": len(b.unbacked), "fences_ok": b.fences_ok,
                          "all_released": b.all_released,
                          "unresolved_below_commit": len(fa.unresolved_below_commit)}}

    def log_findings(self) -> list[str]:
        """ERROR lines and tracebacks in the workers' logs that the fault matrix does not expect
        (its list is made for network cuts; reported, not judged)."""
        out = []
        for path in sorted(self.workdir.glob("w*.log")):
            out += [f"{path.name}: {line}" for line in
                    unexpected_log_lines(path.read_text(errors="replace"))]
        return out

    def kill_all(self) -> None:
        for slot in self.slots:
            if slot.proc.alive():
                slot.proc.kill()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.data_dir or tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"benchmark": "soak", "load_avg_start": load_avg()}
    log(f"data in {workdir}; load average {load_avg()}")
    async with LocalCluster(data_dir=workdir / "cluster", nodes=3, heap=args.heap) as cluster:
        soak = Soak(args, cluster, workdir)
        try:
            result.update(await soak.run())
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the summary line says why
            soak.reasons.append(f"aborted: {exc!r}")
            log(f"aborted: {exc!r}")
        finally:
            soak.kill_all()  # (the cluster's stop continues a node a fault left stopped)
    result.update(settings={k: v for k, v in vars(args).items() if k != "data_dir"}, data_dir=str(workdir),
                  warnings=soak.warnings, reasons=soak.reasons, load_avg_end=load_avg(),
                  elapsed_s=round(time.monotonic() - started, 1))
    result["pass"] = not soak.reasons
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--minutes", type=int, default=90, help="length of the soak (after setup and probe)")
    ap.add_argument("--fault-every", type=float, default=4.5, help="minutes between faults")
    ap.add_argument("--rate", type=float, help="events per second (default: half the probe's maximum)")
    ap.add_argument("--probe-events", type=int, default=4000)
    ap.add_argument("--dup-ratio", type=float, default=0.25, help="share of events that repeat one sent")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--workers", type=int, default=3, help="the last is the one worker faults hit")
    ap.add_argument("--claim-s", type=float, default=30.0, help="the app's claim lease (its default)")
    ap.add_argument("--down-s", type=float, default=20.0, help="how long a killed broker stays down")
    ap.add_argument("--pause-s", type=float, default=20.0, help="how long a broker stays SIGSTOPped")
    ap.add_argument("--recover-s", type=float, default=180.0, help="deadline of each fault's recovery")
    ap.add_argument("--drain-s", type=float, default=300.0, help="deadline for lag 0 at the end")
    ap.add_argument("--store-cache-bytes", type=int,
                    help="the workers' STREAMSCHED_STORE_CACHE_BYTES (smaller: the caches fill sooner)")
    ap.add_argument("--block-cache-bytes", type=int,
                    help="the workers' STREAMSCHED_STORE_BLOCK_CACHE_BYTES (smaller: it fills sooner)")
    ap.add_argument("--tracemalloc-at", type=lambda t: [int(m) for m in t.split(",") if m], default=[],
                    help="minutes (comma-separated) at which the long-lived workers write a tracemalloc "
                         "snapshot (and at the end); the summary reports what grew between them")
    ap.add_argument("--heap", default=DEFAULT_HEAP, help="each broker's -Xmx")
    ap.add_argument("--data-dir", help="cluster, ledger, stores and worker logs (default: a new temp dir)")
    args = ap.parse_args(argv)
    if args.minutes < 1 or args.workers < 1 or args.fault_every <= 0 or not 0 <= args.dup_ratio < 1:
        ap.error("--minutes and --workers at least 1, --fault-every above 0, --dup-ratio in [0, 1)")
    return args


if __name__ == "__main__":
    # This script's own clients (load, lag, admin) retry through every fault, and aiokafka logs each
    # retry (ten a second while a leader is down): not here (a handler filter: the broker runner
    # resets aiokafka's level once the cluster answers). The workers' logs keep theirs.
    quiet = logging.StreamHandler()
    quiet.addFilter(lambda r: r.levelno >= logging.CRITICAL or not r.name.startswith("aiokafka"))
    logging.basicConfig(format="[soak client %(asctime)s] %(levelname)s %(name)s: %(message)s",
                        handlers=[quiet])
    summary = asyncio.run(main(parse()))
    emit(summary)
    sys.exit(0 if summary["pass"] else 1)
