"""Benchmark of the worker turn against raw aiokafka baselines, all in one run on one broker.

Contenders, each a separate process measured the same way from outside:

B1        raw aiokafka: consume + commit per fetched batch (no state, no transactions), sustained
          over at least 100,000 records (``--baseline-records``, 1,000,000 by default: at B1's and
          B3's rates a 125,000-record input passes its 10-90 % window in about 0.2 s, a handful of
          25 ms polls; a million keeps the window above a second).
B2        a hand-written serial loop per record: claim (acks=all) -> no-op -> outcome (acks=all)
          -> commit offset: what a careful user writes without streamsched (kept for continuity:
          ``ratio_p8_to_b2 >= 5`` is the floor set for it, with p8 = the external workload).
B3        raw aiokafka transactional read-process-write: one transactional producer per partition
          and, per partition, one transaction per fetched batch writing K records per input record
          (K-1 state-like records to a compacted topic and one output record partitioned by key)
          plus the offsets: the exactly-once ceiling of our client on this machine. K is what
          streamsched's native workload writes per item, counted from its topics in the warm-up.
          Reads the same ``--baseline-records`` input as B1.
B3/8      the same loop with at most 8 input records (``max_in_flight``) per transaction: the
          transaction shape of streamsched's claim-first (external) workload, which may hold no
          more than ``max_in_flight`` unresolved claims; the reference for ``external``.
native    streamsched, 8 partitions, a Kafka-native command emitting one event per item (the
          shape of consumers/pipelines.py).
external  streamsched, 8 partitions, a no-op external command (the shape of
          consumers/due_runs.py; claim before effect).

Method. All contenders read the same pre-produced 8-partition input topic (fresh groups and, for
streamsched, a fresh scheduler per run). A warm-up pass of every contender runs first (broker JIT,
page cache, imports). The harness polls the group's committed offsets every 25 ms, the process
CPU of the contender and of the broker from ``/proc/<pid>/stat`` (utime + stime), and measures
over the window between 10 % and 90 % of the records committed (start-up, group join, restore and
the tail are outside it; committed offsets trail the work by at most one commit interval at both
edges, which cancels out). Every figure is the median of ``--rounds`` rounds (3 by default), with
its range as ``<key>_range``. Latency: the worker runs at 50 % of its measured maximum rate while
a paced producer feeds it; each item's latency is from the producer's send to the moment its
RELEASED snapshot is visible to a read_committed consumer of the state topic (end to end:
produce, fetch, turn, commit, visibility), over the items after the first 20 %; the
``*_from_record_ms`` keys count from the input record's timestamp instead (what Kafka's own
end-to-end tools measure: without the load generator's queueing). A short latency run of each
workload warms up first (the first run on a fresh broker was 3x slower than the next ones).

Keys: ``<contender>_per_s`` rates (``native_p8_per_s``, ``external_p8_per_s``, ``b1_per_s``,
``b2_per_s``, ``b3_per_s``, ``b3_txn8_per_s``); ``worker_cpu_ms_per_item`` and
``broker_cpu_ms_per_item`` for the native workload (``*_external`` for the external one, ``b3_*``
for B3); ``p50_ms``/``p99_ms`` end-to-end latency of the native workload at half its measured
rate (``*_external_ms`` likewise), and where it goes: ``latency_stages_native_ms`` and
``latency_stages_external_ms``, each stage's p50 and p99 (:data:`STAGES`);
``ratio_native_to_b3``, ``ratio_external_to_b3``, ``ratio_external_to_b3_txn8``;
``ratio_p8_to_b2`` = external / B2 (p8 is the external no-op workload). Earlier versions
reported the worker's per-item ``turn_ms`` quantiles as p50/p99 (execution
only, not end to end) and a B1 timed over a few fetches: not comparable.

Usage: ``python bench/turns.py [--bootstrap HOST:PORT] [--records N] [--rounds R] [--quick]``.
Without ``--bootstrap`` a fresh local broker is started (its pid is then known; with
``--bootstrap`` the broker process is found by its listening port, or ``--broker-pid``). The last
line printed is one JSON object; progress goes to stderr. The machine's load average is reported
at the start and the end (``load_avg``): on a shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turns_app import scheduler as bench_scheduler  # noqa: E402
from streamsched.kafka import clients  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.kafka.reads import read_topic  # noqa: E402
from streamsched.kafka.writer import partition_for_key  # noqa: E402
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind  # noqa: E402
from streamsched.model.identity import route_key  # noqa: E402
from streamsched.model.jsonval import json_dumps  # noqa: E402
from streamsched.model.names import internal_topic  # noqa: E402
from streamsched.testing import WorkerProcess, make_event, produce_events  # noqa: E402
from streamsched.wire.claim import decode_claim, encode_claim  # noqa: E402

PARTITIONS = 8
POLL_S = 0.025
WINDOW = (0.10, 0.90)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- processes and their CPU ------------------------------------------------------------------------


def cpu_s(pid: int | None) -> float:
    """utime + stime of ``pid`` in seconds (0 if unknown or gone)."""
    if pid is None:
        return 0.0
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = data.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def find_broker_pid(bootstrap: str) -> int | None:
    """The pid listening on the first bootstrap address's port (this host only), if visible."""
    try:
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


class Proc:
    """A contender process: a baseline role of this script or a ``streamsched run`` worker."""

    def __init__(self, popen: subprocess.Popen[bytes] | None = None, worker: WorkerProcess | None = None):
        self.popen, self.worker = popen, worker

    @property
    def pid(self) -> int:
        if self.worker is not None:
            return self.worker.pid
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        if self.worker is not None:
            return self.worker.alive()
        assert self.popen is not None
        return self.popen.poll() is None

    def finish(self, timeout: float = 60.0) -> int | None:
        """Stop a worker (SIGTERM: drain and leave); wait for a role, which exits by itself."""
        if self.worker is not None:
            return self.worker.terminate(timeout)
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)


def start_role(role: str, bootstrap: str, logdir: Path, **opts: object) -> Proc:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--bootstrap", bootstrap]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = open(logdir / f"{role}-{uuid.uuid4().hex[:6]}.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return Proc(popen=subprocess.Popen(cmd, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL))
    finally:
        out.close()


def start_worker(bootstrap: str, logdir: Path, kind: str, topic: str, name: str, out: str,
                 commit_interval_s: float, trace: Path | None = None) -> Proc:
    env = {"BENCH_KIND": kind, "BENCH_TOPIC": topic, "BENCH_NAME": name, "BENCH_OUT": out,
           "STREAMSCHED_COMMIT_INTERVAL": f"{commit_interval_s}s",
           # `streamsched run`'s default claim store (on disk), in the run's own directory;
           # STREAMSCHED_STORE_DIR=:memory: in the environment measures the in-memory store.
           "STREAMSCHED_STORE_DIR": os.environ.get("STREAMSCHED_STORE_DIR", str(logdir / "stores"))}
    if trace is not None:
        env["BENCH_TRACE"] = str(trace)  # the handlers note when they run (latency stages)
    w = WorkerProcess("bench.turns_app:app", bootstrap, env=env, log_path=logdir / f"{name}.log")
    return Proc(worker=w.start())


# --- measuring from outside -----------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    per_s: float
    cpu_ms_per_item: float
    broker_cpu_ms_per_item: float
    steps: int = 0
    """Samples inside the measured window (commits, with ``changes_only``): how finely the rate
    is resolved."""


class Offsets:
    """Committed offsets of groups over one topic, through one admin client."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = clients.admin(bootstrap)
        self._coordinators: dict[str, int] = {}

    async def __aenter__(self) -> Offsets:
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()

    async def committed(self, group: str, topic: str) -> int:
        """The sum of ``group``'s committed offsets on ``topic`` (0 while it has none or the
        coordinator is not available yet)."""
        from aiokafka.errors import KafkaError

        try:
            node = self._coordinators.get(group)
            if node is None:
                node = self._coordinators[group] = await self.admin.find_coordinator(group)
            offsets = await self.admin.list_consumer_group_offsets(group, group_coordinator_id=node)
        except KafkaError:
            self._coordinators.pop(group, None)
            return 0
        return sum(o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset > 0)


def crossing(samples: list[tuple[float, ...]], target: float) -> tuple[float, ...] | None:
    """Where a series of ``(time, count, *more)`` samples reaches ``count == target``: time and
    the other fields interpolated linearly between the two samples around it (None if never)."""
    for s0, s1 in itertools.pairwise(samples):
        d0, d1 = s0[1], s1[1]
        if d1 >= target:
            f = (target - d0) / (d1 - d0) if d1 > d0 else 1.0
            return tuple(a + f * (b - a) for i, (a, b) in enumerate(zip(s0, s1, strict=True)) if i != 1)
    return None


async def measure(offsets: Offsets, proc: Proc, group: str, topic: str, total: int, broker_pid: int | None,
                  *, timeout_s: float, changes_only: bool = False) -> Measured:
    """Poll until ``group`` committed ``total`` records of ``topic``; rate and CPU in the window.

    ``changes_only``: keep a sample only when the committed count moved, so progress is taken as
    linear between *commits* rather than between polls. A contender that commits seconds apart
    (Faust at least once, bench/peer_faust.py) would otherwise put a whole step into one 25 ms
    poll; for a worker committing every 0.1 s both give the same rate.
    """
    samples: list[tuple[float, int, float, float]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            done = await offsets.committed(group, topic)
            prev = samples[-1] if samples else (0.0, 0, 0.0, 0.0)
            if not (changes_only and samples and done == prev[1]):
                # A process that exited reads as 0: keep its last figure.
                samples.append((time.perf_counter(), done, cpu_s(proc.pid) or prev[2],
                                cpu_s(broker_pid) or prev[3]))
            if done >= total:
                break
            if not proc.alive():
                # A role exits once its last transaction committed; the group's offsets follow
                # when the commit markers land, a moment later.
                code = proc.finish()
                if code != 0:
                    raise RuntimeError(f"contender pid {proc.pid} exited with {code} at {done}/{total}")
                deadline = min(deadline, time.monotonic() + 10)
            if time.monotonic() > deadline:
                raise TimeoutError(f"contender committed {done}/{total} in {timeout_s:.0f}s")
            await asyncio.sleep(POLL_S)
    finally:
        code = proc.finish()
        if code not in (0, None):
            log(f"contender pid {proc.pid} exited with {code}")

    def at(target: float) -> tuple[float, ...]:
        t, _, c, b = samples[-1]
        return crossing(samples, target) or (t, c, b)

    lo, hi = WINDOW[0] * total, WINDOW[1] * total
    (t_lo, c_lo, b_lo), (t_hi, c_hi, b_hi) = at(lo), at(hi)
    items = hi - lo
    return Measured(per_s=items / max(t_hi - t_lo, 1e-9), cpu_ms_per_item=(c_hi - c_lo) * 1000 / items,
                    broker_cpu_ms_per_item=(b_hi - b_lo) * 1000 / items,
                    steps=sum(1 for _, d, _, _ in samples if lo < d <= hi) + 1)


# --- setup ----------------------------------------------------------------------------------------


def tag() -> str:
    return uuid.uuid4().hex[:8]


async def input_topic(bootstrap: str, partitions: int, n: int) -> str:
    topic = f"bench-{partitions}p-{tag()}"
    await apply(bootstrap, [TopicSpec(topic, partitions)])
    chunk = 5000
    async with Producer(bootstrap, linger_ms=5) as producer:
        for start in range(0, n, chunk):
            events = [make_event("due", f"t{i % 7}", [f"item-{i}"], due_ns=i)
                      for i in range(start, min(n, start + chunk))]
            await produce_events(producer, topic, events)
    return topic


async def output_topic(bootstrap: str, prefix: str, kind: str = "output") -> str:
    name = f"{prefix}-{tag()}"
    await apply(bootstrap, [TopicSpec(name, PARTITIONS, kind=kind)])  # type: ignore[arg-type]
    return name


@dataclass
class Context:
    bootstrap: str
    broker_pid: int | None
    offsets: Offsets
    logdir: Path
    commit_interval_s: float
    writes: int = 2


async def run_b1(ctx: Context, topic: str, total: int) -> Measured:
    group = f"b1-{tag()}"
    proc = start_role("b1", ctx.bootstrap, ctx.logdir, topic=topic, group=group, total=total)
    return await measure(ctx.offsets, proc, group, topic, total, ctx.broker_pid, timeout_s=total / 1000 + 120)


async def run_b2(ctx: Context, topic: str, total: int) -> Measured:
    group = f"b2-{tag()}"
    state = await output_topic(ctx.bootstrap, "b2-state", "state")
    proc = start_role("b2", ctx.bootstrap, ctx.logdir, topic=topic, group=group, total=total, state=state)
    return await measure(ctx.offsets, proc, group, topic, total, ctx.broker_pid, timeout_s=total / 20 + 120)


async def run_b3(ctx: Context, topic: str, total: int, max_batch: int = 4096) -> Measured:
    group = f"b3-{tag()}"
    state = await output_topic(ctx.bootstrap, "b3-state", "state")
    out = await output_topic(ctx.bootstrap, "b3-out")
    proc = start_role("b3", ctx.bootstrap, ctx.logdir, topic=topic, group=group, total=total, state=state,
                      out=out, writes=ctx.writes, max_batch=max_batch)
    return await measure(ctx.offsets, proc, group, topic, total, ctx.broker_pid, timeout_s=total / 200 + 120)


async def run_streamsched(ctx: Context, kind: str, topic: str, total: int,
                          count_writes: bool = False) -> tuple[Measured, float]:
    """One streamsched run; with ``count_writes``, also the records it wrote per item."""
    name = f"bench{kind[0]}{tag()}"
    out = await output_topic(ctx.bootstrap, "bench-out")
    proc = start_worker(ctx.bootstrap, ctx.logdir, kind, topic, name, out, ctx.commit_interval_s)
    m = await measure(ctx.offsets, proc, f"streamsched.{name}", topic, total, ctx.broker_pid,
                      timeout_s=total / 100 + 180)
    writes = 0.0
    if count_writes:
        n = len(await read_topic(ctx.bootstrap, internal_topic("state", name)))
        n += len(await read_topic(ctx.bootstrap, out))
        writes = n / total
    return m, writes


# --- latency at a fixed load ------------------------------------------------------------------------


def _spread_probes(n_per_partition: int) -> list[Any]:
    """Events covering every partition, so a ready worker is proven to own all of them."""
    counts = [0] * PARTITIONS
    probes = []
    i = 0
    while min(counts) < n_per_partition:
        ev = make_event("due", "probe", [f"probe-{i}"], due_ns=i)
        p = partition_for_key(route_key(ev.tenant, ev.target), PARTITIONS)
        if counts[p] < n_per_partition:
            counts[p] += 1
            probes.append(ev)
        i += 1
    return probes


Latency = tuple[float, float, int, float, float, dict[str, tuple[float, float]]]
"""p50 ms, p99 ms, items (from the hand-off to ``send_many``); p50 ms, p99 ms from the input
record's timestamp (its CreateTime, set when the producer appends it); the stages (p50, p99 ms
of each, :data:`STAGES`)."""

STAGES = {
    "native": ("produce", "fetch_queue_select", "gather_resolve", "commit_visible"),
    "external": ("produce", "fetch_queue_select_claim", "claim_commit_execute", "release_wait",
                 "commit_visible"),
}
"""Where an item's end-to-end latency goes, from five clocks of one machine: the hand-off to the
load generator's producer, the input record's CreateTime (appended by that producer), the
handler's start (``BENCH_TRACE``, written by bench/turns_app.py), and the CreateTime of the
item's CLAIMED and RELEASED snapshots (appended by the worker's producer as a transaction's
records are sent, so they mark the start of its commit), and when the RELEASED snapshot became
visible to a read_committed reader. Native: produce (hand-off -> input appended),
fetch_queue_select (-> handler runs: broker append, fetch, the partition's queue, selection,
claim in memory), gather_resolve (-> RELEASED appended: the rest of the gathered checkpoint and
its commit interval, resolution), commit_visible (-> visible: the transaction's round trips,
its markers, the reader's fetch). External: the claim transaction splits the first part
(fetch_queue_select_claim up to the CLAIMED snapshot's append, claim_commit_execute from there to
the handler: the claim transaction's commit), release_wait (handler -> RELEASED appended: the
execution and the wait for the next transaction). Timestamps of records are milliseconds."""


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    if not ordered:
        return 0.0, 0.0
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def latency(ctx: Context, kind: str, rate: float, seconds: float) -> Latency:
    """End-to-end latency at ``rate`` items/s (see module docs and :data:`Latency`)."""
    topic = f"bench-lat-{tag()}"
    await apply(ctx.bootstrap, [TopicSpec(topic, PARTITIONS)])
    name = f"benchl{kind[0]}{tag()}"
    out = await output_topic(ctx.bootstrap, "bench-out")
    sched = bench_scheduler(kind, topic, name, out)
    group = sched.group
    trace = ctx.logdir / f"trace-{name}.txt"
    proc = start_worker(ctx.bootstrap, ctx.logdir, kind, topic, name, out, ctx.commit_interval_s, trace)
    try:
        probes = _spread_probes(2)
        await produce_events(ctx.bootstrap, topic, probes)
        deadline = time.monotonic() + 180
        while await ctx.offsets.committed(group, topic) < len(probes):
            if time.monotonic() > deadline or not proc.alive():
                raise TimeoutError("the latency worker did not become ready")
            await asyncio.sleep(0.1)
        from aiokafka import TopicPartition

        reader = clients.consumer(ctx.bootstrap, fetch_max_wait_ms=5)
        await reader.start()
        tps = [TopicPartition(sched.state_topic, p) for p in range(PARTITIONS)]
        inputs = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        reader.assign(tps + inputs)
        await reader.seek_to_end(*tps, *inputs)
        for tp in tps + inputs:
            await reader.position(tp)
        sent: dict[str, int] = {}
        seen: dict[str, float] = {}
        routes: dict[bytes, str] = {}
        stamped: dict[str, int] = {}
        """Identity -> its input record's timestamp (ms)."""
        seen_record: dict[str, float] = {}
        appended: dict[tuple[str, ClaimStatus], int] = {}
        """(identity, CLAIMED or RELEASED) -> that snapshot's CreateTime (ms)."""
        stop = asyncio.Event()

        async def read() -> None:
            while not stop.is_set():
                batch = await reader.getmany(timeout_ms=20)
                now = time.time_ns()
                for tp, records in batch.items():
                    if tp.topic == topic:
                        for rec in records:
                            identity = routes.get(rec.key)
                            if identity is not None:
                                stamped.setdefault(identity, rec.timestamp)
                        continue
                    for rec in records:
                        st = decode_claim(rec.value)
                        appended.setdefault((st.identity, st.status), rec.timestamp)
                        t0 = sent.get(st.identity)
                        if t0 is not None and st.status is ClaimStatus.RELEASED and st.identity not in seen:
                            seen[st.identity] = (now - t0) / 1e6
                            seen_record[st.identity] = now / 1e6

        reading = asyncio.create_task(read())
        sends: list[asyncio.Task[Any]] = []
        async with Producer(ctx.bootstrap, linger_ms=0) as producer:
            t_start = time.monotonic()
            n = 0
            while (elapsed := time.monotonic() - t_start) < seconds:
                due = int(rate * elapsed)
                if due > n:
                    events = [make_event("due", f"t{i % 7}", [f"lat-{i}"], due_ns=i) for i in range(n, due)]
                    now = time.time_ns()
                    for ev in events:
                        identity = sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)
                        sent[identity] = now
                        routes[route_key(ev.tenant, ev.target)] = identity
                    sends.append(asyncio.create_task(producer.send_many(topic, events)))
                    n = due
                await asyncio.sleep(0.005)
            await asyncio.gather(*sends)
        deadline = time.monotonic() + 60
        while len(seen) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await reading
        await reader.stop()
        if len(seen) < len(sent):
            log(f"latency: {len(sent) - len(seen)} of {len(sent)} items not seen")
        measured = [i for i in list(sent)[len(sent) // 5:] if i in seen]
        p50, p99 = _quantiles([seen[i] for i in measured])
        r50, r99 = _quantiles([seen_record[i] - stamped[i] for i in measured if i in stamped])
    finally:
        proc.finish()
    ran: dict[str, float] = {}
    if trace.exists():
        for line in trace.read_text().splitlines():
            identity, _, ns = line.partition(" ")
            ran.setdefault(identity, int(ns) / 1e6)
    stages = _stages(kind, measured, sent, stamped, ran, appended, seen_record)
    return p50, p99, len(measured), r50, r99, stages


def _stages(kind: str, measured: list[str], sent: dict[str, int], stamped: dict[str, int],
            ran: dict[str, float], appended: dict[tuple[str, ClaimStatus], int],
            visible: dict[str, float]) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each of :data:`STAGES` over the items every clock saw."""
    rows: list[list[float]] = []
    for i in measured:
        released = appended.get((i, ClaimStatus.RELEASED))
        claimed = appended.get((i, ClaimStatus.CLAIMED))
        if i not in stamped or i not in ran or released is None or (kind == "external" and claimed is None):
            continue
        clocks = [sent[i] / 1e6, float(stamped[i])]
        if kind == "external":
            assert claimed is not None
            clocks.append(float(claimed))
        clocks += [ran[i], float(released), visible[i]]
        rows.append([b - a for a, b in itertools.pairwise(clocks)])
    return {name: _quantiles([r[k] for r in rows]) for k, name in enumerate(STAGES[kind])} if rows else {}


# --- the run --------------------------------------------------------------------------------------


def med(values: list[float], digits: int = 1) -> tuple[float, list[float]]:
    return round(statistics.median(values), digits), [round(min(values), digits), round(max(values), digits)]


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    records, rounds = args.records, args.rounds
    fast_records = max(records, args.baseline_records)  # B1 and B3 (see the module docs)
    b2_records = max(500, records // 50)
    b3_8_records = max(2000, records // 5)  # a slow loop: a fifth of the input is plenty
    started = load_avg()
    log(f"records={records} rounds={rounds} broker_pid={broker_pid} load={started}")
    async with Offsets(bootstrap) as offsets:
        ctx = Context(bootstrap, broker_pid, offsets, logdir, args.commit_interval)
        warm_n = args.warmup
        log(f"producing warm-up ({warm_n}) and input ({records}, {b2_records}) topics")
        warm = await input_topic(bootstrap, PARTITIONS, warm_n)
        warm_b2 = await input_topic(bootstrap, 1, 200)
        main_topic = await input_topic(bootstrap, PARTITIONS, records)
        if fast_records > records:
            log(f"producing the baselines' input ({fast_records})")
            fast_topic = await input_topic(bootstrap, PARTITIONS, fast_records)
        else:
            fast_topic = main_topic
        b2_topic = await input_topic(bootstrap, 1, b2_records)

        log("warm-up pass")
        _, native_writes = await run_streamsched(ctx, "native", warm, warm_n, count_writes=True)
        _, external_writes = await run_streamsched(ctx, "external", warm, warm_n, count_writes=True)
        ctx.writes = max(1, round(native_writes))
        await run_b1(ctx, warm, warm_n)
        await run_b3(ctx, warm, warm_n)
        await run_b3(ctx, warm, warm_n // 5, max_batch=8)
        await run_b2(ctx, warm_b2, 200)
        log(f"writes per item: native {native_writes:.3f}, external {external_writes:.3f}; "
            f"B3 writes {ctx.writes}")

        res: dict[str, list[Measured]] = {k: [] for k in ("b1", "b2", "b3", "b3_8", "native", "external")}
        for r in range(rounds):
            res["b1"].append(await run_b1(ctx, fast_topic, fast_records))
            res["b3"].append(await run_b3(ctx, fast_topic, fast_records))
            res["b3_8"].append(await run_b3(ctx, main_topic, b3_8_records, max_batch=8))
            res["native"].append((await run_streamsched(ctx, "native", main_topic, records))[0])
            res["external"].append((await run_streamsched(ctx, "external", main_topic, records))[0])
            res["b2"].append(await run_b2(ctx, b2_topic, b2_records))
            log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1].per_s:.0f}/s" for k, v in res.items())
                + f" load={load_avg()}")

        def rate(k: str) -> tuple[float, list[float]]:
            return med([m.per_s for m in res[k]])

        def cpu(k: str, broker: bool = False) -> tuple[float, list[float]]:
            return med([m.broker_cpu_ms_per_item if broker else m.cpu_ms_per_item for m in res[k]], 4)

        native, external = rate("native")[0], rate("external")[0]
        lat: dict[str, list[Latency]] = {"native": [], "external": []}
        log("latency warm-up pass")  # the first latency run of a fresh broker is an outlier
        for kind, max_rate in (("native", native), ("external", external)):
            await latency(ctx, kind, 0.5 * max_rate, min(3.0, args.latency_seconds))
        for _ in range(rounds):
            for kind, max_rate in (("native", native), ("external", external)):
                lat[kind].append(await latency(ctx, kind, 0.5 * max_rate, args.latency_seconds))
            log(f"latency: native {lat['native'][-1]}, external {lat['external'][-1]}")

    out: dict[str, Any] = {"records": records, "baseline_records": fast_records, "rounds": rounds,
                           "partitions": PARTITIONS, "commit_interval_s": args.commit_interval}
    for key, k in (("b1_per_s", "b1"), ("b2_per_s", "b2"), ("b3_per_s", "b3"), ("b3_txn8_per_s", "b3_8"),
                   ("native_p8_per_s", "native"), ("external_p8_per_s", "external")):
        out[key], out[key + "_range"] = rate(k)
    b3 = out["b3_per_s"]
    out["b3_writes_per_record"] = ctx.writes
    out["native_writes_per_item"] = round(native_writes, 3)
    out["external_writes_per_item"] = round(external_writes, 3)
    out["ratio_native_to_b3"] = round(native / b3, 3)
    out["ratio_external_to_b3"] = round(external / b3, 3)
    out["ratio_external_to_b3_txn8"] = round(external / out["b3_txn8_per_s"], 3)
    out["ratio_p8_to_b2"] = round(external / out["b2_per_s"], 2)
    out["ratio_b1_to_b3"] = round(out["b1_per_s"] / b3, 2)
    for key, k, broker in (("worker_cpu_ms_per_item", "native", False),
                           ("broker_cpu_ms_per_item", "native", True),
                           ("worker_cpu_ms_per_item_external", "external", False),
                           ("broker_cpu_ms_per_item_external", "external", True),
                           ("b3_cpu_ms_per_item", "b3", False), ("b3_broker_cpu_ms_per_item", "b3", True),
                           ("b3_txn8_cpu_ms_per_item", "b3_8", False),
                           ("b3_txn8_broker_cpu_ms_per_item", "b3_8", True),
                           ("b1_cpu_ms_per_item", "b1", False)):
        out[key], out[key + "_range"] = cpu(k, broker)
    for suffix, kind in (("", "native"), ("_external", "external")):
        out[f"p50{suffix}_ms"], out[f"p50{suffix}_ms_range"] = med([x[0] for x in lat[kind]], 2)
        out[f"p99{suffix}_ms"], out[f"p99{suffix}_ms_range"] = med([x[1] for x in lat[kind]], 2)
        # From the input record's timestamp: without the load generator's own queueing.
        out[f"p50{suffix}_from_record_ms"], out[f"p50{suffix}_from_record_ms_range"] = med(
            [x[3] for x in lat[kind]], 2)
        out[f"p99{suffix}_from_record_ms"], out[f"p99{suffix}_from_record_ms_range"] = med(
            [x[4] for x in lat[kind]], 2)
    for kind in ("native", "external"):
        # Each stage's p50 and p99, median over the rounds: where the latency above goes.
        out[f"latency_stages_{kind}_ms"] = {
            name: {q: med([x[5][name][k] for x in lat[kind] if name in x[5]] or [0.0], 2)[0]
                   for k, q in enumerate(("p50", "p99"))}
            for name in STAGES[kind]}
    out["latency_load_per_s"] = round(0.5 * native, 1)
    out["latency_load_external_per_s"] = round(0.5 * external, 1)
    out["latency_items"] = sum(x[2] for x in lat["native"])
    out["load_avg"] = {"start": started, "end": load_avg()}
    out["broker_cpu_measured"] = broker_pid is not None
    return out


# --- baseline roles (run as child processes) ---------------------------------------------------------


async def role_b1(bootstrap: str, topic: str, group: str, total: int) -> None:
    consumer = clients.consumer(bootstrap, topic, group_id=group, max_partition_fetch_bytes=1024 * 1024)
    await consumer.start()
    try:
        seen = 0
        while seen < total:
            batch = await consumer.getmany(timeout_ms=200, max_records=2000)
            n = sum(len(v) for v in batch.values())
            if n:
                await consumer.commit()
                seen += n
    finally:
        await consumer.stop()


async def role_b2(bootstrap: str, topic: str, group: str, total: int, state: str) -> None:
    from aiokafka import TopicPartition

    producer = clients.producer(bootstrap, linger_ms=0)
    consumer = clients.consumer(bootstrap, topic, group_id=group)
    await producer.start()
    await consumer.start()
    try:
        done = 0
        while done < total:
            batch = await consumer.getmany(timeout_ms=500, max_records=1)
            for tp, records in batch.items():
                for rec in records:
                    key = rec.key or b""
                    await producer.send_and_wait(state, b"claim", key=key)
                    await producer.send_and_wait(state, b"outcome+release", key=key)
                    await consumer.commit({TopicPartition(tp.topic, tp.partition): rec.offset + 1})
                    done += 1
    finally:
        await consumer.stop()
        await producer.stop()


def _sample_values() -> tuple[bytes, bytes]:
    """A state record and an output record of the sizes streamsched writes."""
    identity = bench_scheduler("native", "bench", "bench", "bench-out").resolve_identity(0, "t0", ("item-0",))
    st = ClaimState(identity, ClaimStatus.RELEASED, "", 1, 0, 1, 3,
                    Outcome(OutcomeKind.SUCCEEDED, 1, time.time_ns(), 1, b"\x00" * 32))
    out = json_dumps({"event": "pipeline.started", "pipeline": "item-0", "idempotency_key": identity,
                      "fence": 1})
    return encode_claim(st), out


async def _send_grouped(prod: Any, groups: dict[tuple[str, int], list[tuple[bytes | None, bytes]]]) -> None:
    """One record batch per partition (raw aiokafka ``create_batch``/``send_batch``), all acked."""
    futures = []
    for (t, part), recs in groups.items():
        batch = prod.create_batch()
        for key, value in recs:
            if batch.append(key=key, value=value, timestamp=None, headers=[]) is None:
                futures.append(await prod.send_batch(batch, t, partition=part))
                batch = prod.create_batch()
                batch.append(key=key, value=value, timestamp=None, headers=[])
        futures.append(await prod.send_batch(batch, t, partition=part))
    await asyncio.gather(*futures)


async def role_b3(bootstrap: str, topic: str, group: str, total: int, state: str, out: str,
                  writes: int, max_batch: int) -> None:
    from aiokafka import TopicPartition

    state_value, out_value = _sample_values()
    consumer = clients.consumer(bootstrap, topic, group_id=group, max_partition_fetch_bytes=1024 * 1024)
    await consumer.start()
    producers: dict[int, Any] = {}
    queues: dict[int, deque[Any]] = {}
    wakes: dict[int, asyncio.Event] = {}
    processed = [0]
    finished = asyncio.Event()

    async def partition_loop(p: int) -> None:
        prod, queue, wake = producers[p], queues[p], wakes[p]
        while not finished.is_set():
            if not queue:
                wake.clear()
                await wake.wait()
                continue
            records = [queue.popleft() for _ in range(min(len(queue), max_batch))]
            groups: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
            for rec in records:
                if writes > 1:
                    groups.setdefault((state, p), []).extend([(rec.key, state_value)] * (writes - 1))
                groups.setdefault((out, partition_for_key(rec.key or b"", PARTITIONS)), []).append(
                    (rec.key, out_value))
            await prod.begin_transaction()
            try:
                await _send_grouped(prod, groups)
                marks = {TopicPartition(topic, p): records[-1].offset + 1}
                await prod.send_offsets_to_transaction(marks, group)
                await prod.commit_transaction()
            except BaseException:
                await prod.abort_transaction()
                raise
            processed[0] += len(records)
            if processed[0] >= total:
                finished.set()
                for w in wakes.values():
                    w.set()

    try:
        early: list[Any] = []  # records fetched while waiting for the assignment
        while not consumer.assignment():
            for records in (await consumer.getmany(timeout_ms=100, max_records=1)).values():
                early.extend(records)
        parts = sorted(tp.partition for tp in consumer.assignment())
        for p in parts:
            producers[p] = clients.transactional_producer(
                bootstrap, f"b3.{group}.{p}", max_batch_size=1024 * 1024, max_request_size=2 * 1024 * 1024)
            await producers[p].start()
            queues[p], wakes[p] = deque(), asyncio.Event()
        for rec in early:
            queues[rec.partition].append(rec)
            wakes[rec.partition].set()
        tasks = [asyncio.create_task(partition_loop(p)) for p in parts]
        while not finished.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1024)
            for tp, records in batch.items():
                queues[tp.partition].extend(records)
                wakes[tp.partition].set()
            for tp in consumer.assignment():
                # Bounded buffering, like the worker's queue bound.
                if len(queues[tp.partition]) > 4096:
                    consumer.pause(tp)
                elif tp in consumer.paused():
                    consumer.resume(tp)
            for t in tasks:
                if t.done():
                    await t  # a failed loop fails the role
        await asyncio.gather(*tasks)
    finally:
        for prod in producers.values():
            await prod.stop()
        await consumer.stop()


def run_role(args: argparse.Namespace) -> None:
    if args.role == "b1":
        asyncio.run(role_b1(args.bootstrap, args.topic, args.group, args.total))
    elif args.role == "b2":
        asyncio.run(role_b2(args.bootstrap, args.topic, args.group, args.total, args.state))
    elif args.role == "b3":
        asyncio.run(role_b3(args.bootstrap, args.topic, args.group, args.total, args.state, args.out,
                            args.writes, args.max_batch))
    else:
        raise SystemExit(f"unknown role {args.role}")


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--broker-pid", type=int, default=None, help="the broker's pid (default: found by port)")
    ap.add_argument("--records", type=int, default=125_000,
                    help="input records per run (the 10-90%% window then covers 100,000)")
    ap.add_argument("--baseline-records", type=int, default=1_000_000,
                    help="input records of the raw baselines B1 and B3 (at least --records)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5000, help="records of the warm-up pass")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--commit-interval", type=float, default=0.1,
                    help="STREAMSCHED_COMMIT_INTERVAL (seconds) of the streamsched workers")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run (10,000 records, 1 round, short latency phase): not a figure")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--writes", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=4096, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        run_role(args)
        return
    if args.quick:
        args.records, args.rounds, args.warmup, args.latency_seconds = 10_000, 1, 2000, 4.0
        args.baseline_records = args.records
    print(json.dumps(run_on_broker(main, args, prefix="streamsched-bench-")))


def run_on_broker(main: Callable[[str, int | None, argparse.Namespace, Path], Coroutine[Any, Any, Any]],
                  args: argparse.Namespace, *, prefix: str) -> Any:
    """``main(bootstrap, broker_pid, args, logdir)`` on ``--bootstrap``, else on a fresh local
    broker started (and stopped) here; logdir is a temporary directory."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        logdir = Path(tmp)
        if args.bootstrap:
            pid = args.broker_pid or find_broker_pid(args.bootstrap)
            return asyncio.run(main(args.bootstrap, pid, args, logdir))
        from streamsched.ops.broker import LocalCluster

        cluster = LocalCluster(data_dir=logdir / "broker")
        try:
            bootstrap = cluster.start()
            return asyncio.run(main(bootstrap, cluster.procs[1].pid, args, logdir))
        finally:
            cluster.stop()


if __name__ == "__main__":
    cli()
