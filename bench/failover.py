"""Failover benchmark: how fast workers recover from a killed or paused broker in a 3-node cluster.

Setup: a local three-node KRaft cluster (:class:`~streamsched.ops.broker.LocalCluster`, Kafka's
default ``broker.session.timeout.ms`` of 9 s, replication 3, ``min.insync.replicas`` 2), one
transition topic of ``--partitions`` partitions (RF 3), ``--workers`` worker processes running
the reference app ``consumers.due_runs`` (``streamsched run``, real processes, the documented
default client settings; only the app's claim lease is 5 s), and a steady load of ``--rate``
events per second produced by this script. A warm-up runs first (every partition executes, lag
back to its steady level).

Scenarios, each ``--rounds`` times (default 3; ``--quick``: 1):

kill   ``kill -9`` of the broker that coordinates the workers' group (it also leads partitions
       and coordinates some transactional ids); restarted once lag is back (or after
       ``--max-wait-s``), and the cluster is given time to bring every replica back in sync.
pause  SIGSTOP of the group coordinator for ``--pause-s`` (30 s), then SIGCONT.

Measured from the fault (the signal), per scenario:

* ``first_progress_s``: the first partition that executes work sent after the fault (an effect in
  the app's ledger, timestamped by the app) or commits offsets past its end at the fault (work
  already in hand at the fault finishing is not progress);
* ``all_partitions_progress_s``: when the last partition did;
* ``lag_zero_s``: when the group's total lag (transition and delay topics, committed offsets
  against read_committed ends) is back at or below its steady level, the largest total lag
  polled in the ``--steady-s`` before the fault (at least 1), after every partition progressed.

The last line printed is one JSON object: the medians ``kill_first_progress_s``,
``kill_all_partitions_progress_s``, ``kill_lag_zero_s``, ``pause_*`` likewise, each with its
rounds as ``<key>_rounds``, the settings used (``settings``), the machine's load average
(``load_avg``), and the worker-log noise counted (``sender_errors``, ``unretrieved_tasks``,
``reenqueue_key_errors``) and ``shutdown_paused_broker``: each worker's exit code and seconds
to exit after SIGTERM, sent 3 s after the group coordinator was paused (the drain deadline is
10 s). Progress goes to stderr.

Usage: ``python bench/failover.py [--rounds N] [--quick] [--partitions 6] [--workers 2]
[--scenarios kill,pause] [--broker-config KEY=VALUE ...]`` (a broker setting over Kafka's
defaults shows what the brokers' own timeouts cost; the targets are for the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from consumers.harness import Workflow  # noqa: E402
from streamsched.kafka import clients  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.kafka.reads import coordinators  # noqa: E402
from streamsched.kafka.writer import partition_for_key  # noqa: E402
from streamsched.model.identity import route_key  # noqa: E402
from streamsched.model.names import internal_topic  # noqa: E402
from streamsched.ops.broker import LocalCluster  # noqa: E402
from streamsched.testing import WorkerProcess, make_event  # noqa: E402

POLL_S = 0.5
MONITOR_TIMEOUT_MS = 3000
"""The monitor's own request timeout: a poll that hits the dead broker costs resolution only."""


def log(msg: str) -> None:
    print(f"[failover {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Load:
    """A steady stream of due events, ``rate`` per second, sent in batches every 100 ms."""

    bootstrap: str
    wf: Workflow
    partitions: int
    rate: float
    partition_of: dict[str, int] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    sent: int = 0
    failed: int = 0
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def batch(self, n: int) -> list[Any]:
        events = []
        for _ in range(n):
            run_id = f"run-{next(self.counter)}"
            ev = make_event("due", "t", [run_id], due_ns=1_700_000_000 * 10**9)
            self.partition_of[run_id] = partition_for_key(route_key(ev.tenant, ev.target), self.partitions)
            self.created[run_id] = time.time()
            events.append(ev)
        return events

    async def send(self, producer: Producer, events: list[Any]) -> None:
        """One batch; a failed one is counted and dropped (bench/soak.py resends instead)."""
        try:
            await producer.send_many(self.wf.topic, events)
            self.sent += len(events)
        except Exception as exc:  # noqa: BLE001 - a fault may fail a send; the load goes on
            self.failed += len(events)
            log(f"load: a send failed: {exc!r}")

    async def run(self, stop: asyncio.Event, *, drain_s: float = 30.0) -> None:
        """Send until ``stop``, then wait up to ``drain_s`` for the sends still outstanding."""
        per_tick = max(1, round(self.rate / 10))
        outstanding: set[asyncio.Task[None]] = set()
        async with Producer(self.bootstrap, linger_ms=5) as producer:
            while not stop.is_set():
                if len(outstanding) < 100:  # bounded while a leader is unreachable
                    task = asyncio.create_task(self.send(producer, self.batch(per_tick)))
                    outstanding.add(task)
                    task.add_done_callback(outstanding.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)
            if outstanding:
                await asyncio.wait(outstanding, timeout=drain_s)


class Monitor:
    """Polls the group's committed offsets and the topics' ends with its own short timeouts."""

    def __init__(self, bootstrap: str, wf: Workflow, partitions: int) -> None:
        self.bootstrap, self.wf, self.partitions = bootstrap, wf, partitions
        self.delay = internal_topic("delay", wf.name)
        self.admin: Any = None
        self.consumer: Any = None
        self.samples: list[tuple[float, dict[int, int], dict[int, int], int]] = []
        """(time, committed offset and end per transition partition, total lag) per poll."""

    async def start(self) -> None:
        opts = {"request_timeout_ms": MONITOR_TIMEOUT_MS, "metadata_max_age_ms": 2000}
        self.admin = clients.admin(self.bootstrap, **opts)
        await self.admin.start()
        self.consumer = clients.consumer(self.bootstrap, **opts)
        await self.consumer.start()

    async def stop(self) -> None:
        for close in (self.consumer.stop, self.admin.close):
            with contextlib.suppress(Exception):
                await close()

    async def poll_once(self) -> None:
        from aiokafka import TopicPartition

        tps = [TopicPartition(t, p) for t in (self.wf.topic, self.delay) for p in range(self.partitions)]
        committed = await self.admin.list_consumer_group_offsets(self.wf.group)
        end = await self.consumer.end_offsets(tps)
        at = time.time()
        offsets = {tp: (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else 0)
                   for tp in tps}
        lag = sum(max(0, int(end[tp]) - offsets[tp]) for tp in tps)
        mine = [tp for tp in tps if tp.topic == self.wf.topic]
        self.samples.append((at, {tp.partition: offsets[tp] for tp in mine},
                             {tp.partition: int(end[tp]) for tp in mine}, lag))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            # A poll against a dead broker fails; the next one may not.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.poll_once(), MONITOR_TIMEOUT_MS / 1000 + 2)
            await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - started)))

    def lag_now(self) -> int | None:
        return self.samples[-1][3] if self.samples else None


def executions_since(ledger: Path, since_ns: int) -> list[tuple[str, int]]:
    """(run id, effect time ns) of every effect at or after ``since_ns``."""
    if not ledger.exists():
        return []
    db = sqlite3.connect(ledger, timeout=30)
    try:
        return list(db.execute("SELECT run_id, at_ns FROM effects WHERE at_ns >= ?", (since_ns,)))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


async def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            log(f"timed out after {timeout:.0f}s waiting for {what}")
            return False
        await asyncio.sleep(0.25)
    return True


async def roles(bootstrap: str, wf: Workflow, partitions: int) -> dict[str, Any]:
    """Which node coordinates the group, each partition's transactional id, and leads what."""
    found = await coordinators(bootstrap, wf.group, wf.topic, partitions,
                               request_timeout_ms=MONITOR_TIMEOUT_MS)
    group, txn = found.group, [found.transactions[p] for p in range(partitions)]
    admin = clients.admin(bootstrap, request_timeout_ms=MONITOR_TIMEOUT_MS)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([wf.topic])
        leaders = {p["partition"]: p["leader"] for p in described["partitions"]}
        return {"group_coordinator": group, "txn_coordinators": txn, "leaders": leaders}
    finally:
        await admin.close()


async def in_sync(bootstrap: str, topics: list[str]) -> bool:
    admin = clients.admin(bootstrap, request_timeout_ms=MONITOR_TIMEOUT_MS)
    try:
        await admin.start()
        described = await admin.describe_topics(topics)
        return all(len(p["isr"]) == len(p["replicas"]) for t in described for p in t["partitions"])
    except Exception:  # noqa: BLE001
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def scenario(kind: str, cluster: LocalCluster, wf: Workflow, load: Load, mon: Monitor,
                   args: argparse.Namespace) -> dict[str, float | None]:
    await asyncio.sleep(args.steady_s)
    steady = [lag for at, _, _, lag in mon.samples if at >= time.time() - args.steady_s]
    threshold = max([1, *steady])
    r = await roles(cluster.bootstrap, wf, args.partitions)
    victim = r["group_coordinator"]
    led = sorted(p for p, n in r["leaders"].items() if n == victim)
    txn = sorted(p for p, n in enumerate(r["txn_coordinators"]) if n == victim)
    log(f"{kind}: victim node {victim} (group coordinator; leads partitions {led}; transaction "
        f"coordinator of partitions {txn}); steady lag <= {threshold}")
    ends = mon.samples[-1][2] if mon.samples else {}  # committing past these: work sent after
    t0 = time.time()
    cluster.kill_node(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    progressed: dict[int, float] = {}
    lag_zero: float | None = None
    resumed = False
    deadline = t0 + args.max_wait_s
    try:
        while time.time() < deadline:
            await asyncio.sleep(POLL_S)
            if kind == "pause" and not resumed and time.time() >= t0 + args.pause_s:
                cluster.kill_node(victim, signal.SIGCONT)
                resumed = True
                log(f"pause: node {victim} resumed after {time.time() - t0:.1f}s")
            # Progress: work sent after the fault executed, or offsets committed past it (work
            # in hand at the fault finishing is not recovery).
            for run_id, at_ns in executions_since(wf.ledger, int(t0 * 1e9)):
                p = load.partition_of.get(run_id)
                if p is not None and load.created.get(run_id, 0.0) > t0:
                    progressed[p] = min(progressed.get(p, float("inf")), at_ns / 1e9 - t0)
            for at, committed, _, _ in mon.samples:
                if at > t0:
                    for p, off in committed.items():
                        if p in ends and off > ends[p]:
                            progressed[p] = min(progressed.get(p, float("inf")), at - t0)
            if len(progressed) == args.partitions and lag_zero is None:
                for at, _, _, lag in mon.samples:
                    if at > t0 and at - t0 >= max(progressed.values()) and lag <= threshold:
                        lag_zero = at - t0
                        break
            if lag_zero is not None and (kind == "kill" or resumed):
                break
    finally:
        if kind == "pause" and not resumed:
            cluster.kill_node(victim, signal.SIGCONT)
    first = min(progressed.values()) if progressed else None
    every = max(progressed.values()) if len(progressed) == args.partitions else None
    log(f"{kind}: first progress {first}, all partitions {every}, lag zero {lag_zero} "
        f"(per partition {dict(sorted((p, round(s, 1)) for p, s in progressed.items()))})")
    if kind == "kill":
        cluster.start_node(victim)
        log(f"kill: node {victim} restarted")
    topics = [wf.topic, wf.state_topic, internal_topic("delay", wf.name)]
    await wait_until_async(lambda: in_sync(cluster.bootstrap, topics), 120, "every replica in sync")
    await wait_until(lambda: (mon.lag_now() or 0) <= threshold, 120, "steady lag")
    return {"first_progress_s": first, "all_partitions_progress_s": every, "lag_zero_s": lag_zero,
            "victim": victim, "victim_leads": len(led), "victim_txn_coordinates": len(txn)}


async def wait_until_async(cond: Callable[[], Any], timeout: float, what: str) -> bool:
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            log(f"timed out after {timeout:.0f}s waiting for {what}")
            return False
        await asyncio.sleep(1)
    return True


def count_in_logs(logs: list[Path], needle: str) -> int:
    return sum(p.read_text(errors="replace").count(needle) for p in logs if p.exists())


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return None  # a round that never recovered makes the median unknown, not better
    return round(statistics.median(known), 2)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.data_dir or tempfile.mkdtemp(prefix="failover-"))
    log(f"data in {workdir}; load average {load_avg()}")
    settings = {"partitions": args.partitions, "workers": args.workers, "rate_per_s": args.rate,
                "pause_s": args.pause_s, "rounds": args.rounds, "nodes": 3, "replication": 3,
                "min_insync_replicas": 2, "broker_session_timeout_ms": 9000,
                "claim_duration_s": 5.0, "client_settings": "documented defaults",
                "broker_config": args.broker_config or "Kafka's defaults",
                "metadata_max_age_ms": clients.METADATA_MAX_AGE_MS}
    result: dict[str, Any] = {"settings": settings, "load_avg_start": load_avg()}
    cluster_dir = workdir / "cluster"
    async with LocalCluster(data_dir=cluster_dir, nodes=3, extra_config=args.broker_config) as cluster:
        bootstrap = cluster.bootstrap
        wf = Workflow("due_runs", f".fo-{uuid.uuid4().hex[:6]}", workdir / "ledger.sqlite3")
        await apply(bootstrap, [TopicSpec(wf.topic, args.partitions, replication=3)])
        env = {**wf.env, "STREAMSCHED_CLAIM_DURATION_S": "5"}
        logs = [workdir / f"worker-{i}.log" for i in range(args.workers)]
        workers = [WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=logs[i], cwd=ROOT).start()
                   for i in range(args.workers)]
        load = Load(bootstrap, wf, args.partitions, args.rate)
        mon = Monitor(bootstrap, wf, args.partitions)
        stop = asyncio.Event()
        load_task = asyncio.create_task(load.run(stop))
        await mon.start()
        mon_task = asyncio.create_task(mon.run(stop))
        try:
            log("warm-up")
            t_warm = time.time()
            ok = await wait_until(lambda: len({load.partition_of.get(r) for r, _ in
                                               executions_since(wf.ledger, int(t_warm * 1e9))})
                                  >= args.partitions, 180, "every partition to execute")
            await asyncio.sleep(args.warmup_s)
            ok = ok and await wait_until(lambda: (mon.lag_now() or 10**9) <= 2 * args.rate, 120,
                                         "warm-up lag")
            if not ok:
                raise SystemExit("warm-up failed; worker log tail:\n" + workers[0].log_tail(40))
            rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in args.scenarios}
            for i in range(args.rounds):
                for kind in args.scenarios:
                    log(f"round {i + 1}/{args.rounds}: {kind}")
                    rounds[kind].append(await scenario(kind, cluster, wf, load, mon, args))
                    dead = [w.pid for w in workers if not w.alive()]
                    if dead:
                        raise SystemExit(f"worker(s) {dead} died during {kind}")
        finally:
            stop.set()
            await asyncio.gather(load_task, mon_task, return_exceptions=True)
            await mon.stop()
        for kind, runs in rounds.items():
            for key in ("first_progress_s", "all_partitions_progress_s", "lag_zero_s"):
                values = [run[key] for run in runs]
                result[f"{kind}_{key}"] = median(values)
                result[f"{kind}_{key}_rounds"] = [None if v is None else round(v, 2) for v in values]
            result[f"{kind}_victims"] = [{k: run[k] for k in ("victim", "victim_leads",
                                                              "victim_txn_coordinates")} for run in runs]
        # Shutdown while the group coordinator is paused, timed (the drain deadline is 10 s).
        victim = (await roles(cluster.bootstrap, wf, args.partitions))["group_coordinator"]
        cluster.kill_node(victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(3)
            started = time.monotonic()
            for w in workers:
                w.signal(signal.SIGTERM)
            shutdown = []
            for w in workers:
                code = await asyncio.to_thread(w.wait, 60)
                shutdown.append({"exit": code, "s": round(time.monotonic() - started, 2)})
        finally:
            cluster.kill_node(victim, signal.SIGCONT)
        result["shutdown_paused_broker"] = shutdown
        result["load_sent"], result["load_failed"] = load.sent, load.failed
        result["sender_errors"] = count_in_logs(logs, "Unexpected error in sender routine")
        result["unretrieved_tasks"] = count_in_logs(logs, "exception was never retrieved")
        result["reenqueue_key_errors"] = count_in_logs(logs, "reenqueue")
        # The brokers' own wait: a transaction coordinator's markers to a stopped broker stay in
        # flight for the brokers' request.timeout.ms, and the transaction with them.
        result["txn_marker_timeouts"] = count_in_logs(
            sorted(cluster_dir.glob("node-*/server.log")),
            "Cancelled in-flight WRITE_TXN_MARKERS")
    result["load_avg_end"] = load_avg()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, for development")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=40.0, help="events per second")
    ap.add_argument("--pause-s", type=float, default=30.0)
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--max-wait-s", type=float, default=120.0)
    ap.add_argument("--data-dir", help="keep the cluster, ledger and worker logs here")
    ap.add_argument("--scenarios", default="kill,pause", help="comma-separated: kill, pause")
    ap.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting over Kafka's default, on every node (repeatable)")
    args = ap.parse_args(argv)
    args.scenarios = [k for k in args.scenarios.split(",") if k]
    if not args.scenarios or set(args.scenarios) - {"kill", "pause"}:
        ap.error("--scenarios takes kill and/or pause")
    if any("=" not in kv for kv in args.broker_config):
        ap.error("--broker-config takes KEY=VALUE")
    args.broker_config = dict(kv.split("=", 1) for kv in args.broker_config)
    if args.quick:
        args.rounds = 1
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse()))), flush=True)
