"""Rolling restarts: what restarting every worker in turn costs, with static and dynamic membership.

Setup: a local three-node KRaft cluster (:class:`~streamsched.ops.broker.LocalCluster`, JVM heaps
of 384 MB), per scenario a fresh transition topic of ``--partitions`` (48) partitions (RF 3) and
``--workers`` (6) ``streamsched run`` processes of one scheduler whose external command returns at
once (bench/rolling_app.py; claims on disk, one store directory per worker slot, as a pod's
volume), and a steady load of ``--rate`` (100) new identities a second, round-robin over the
partitions, for the whole scenario (bench/rolling_watch.py says how, and how progress is seen:
the group's committed offsets polled every 100 ms, the times each partition's offset advanced).

Scenarios (``--scenarios``, default both, in this order):

static   each worker runs with ``STREAMSCHED_INSTANCE_ID=w<i>`` (as ``--instance-id``) and
         ``STREAMSCHED_SESSION_TIMEOUT`` ``--static-session-timeout`` (30s);
dynamic  no instance id, the default session timeout (10s).

Each: a warm-up (every worker in the group, every partition advanced, ``--warmup-s``, then until
the start-up backlog is down to one second of load or stopped shrinking for 30 s; what is left,
in seconds of load, is ``<scenario>_warmup_backlog_s``: more than a few seconds means the machine
does not keep up with ``--rate`` and no figure is steady-state), a steady span of
``--steady-s`` without restarts, then the roll, as a Deployment or StatefulSet does it: for each
worker in turn, SIGTERM it, wait for it to exit, start its successor (same slot, same instance id
in static), wait until the successor holds partitions in the group and each of them advanced
again, and every partition of the topic advanced since (or ``--resume-deadline-s``), then
``--settle-s`` more before the next worker. Then the load stops, the workers drain it and are
stopped, and the call files are audited.

Per restart (``<scenario>_restarts``): ``restarted_resume_s``, from the successor's process start
until each partition the group gave it advanced past its offset at the first poll after the
successor appeared in the group (None: not within the deadline); ``others_max_stall_s``, the
longest time any partition held by neither the stopped worker nor its successor went without
advancing, from SIGTERM to the end of the settle (counted from its last advance before SIGTERM, so
the normal gap between advances is in it); ``restarted_max_stall_s``, the same for the stopped
worker's partitions; ``others_moved``, partitions of the other workers whose owner changed;
``successor_exit``, the successor's exit code if it exited on its own during its restart (None:
running); ``exit_s``, SIGTERM to exit; ``successor_boot_s``, the successor's process start until
its worker's metrics exist (interpreter, imports, the app; read from the snapshot it prints as it
exits), the part of a resume that membership cannot save. The normal gap: ``steady_max_stall_s``,
the same longest gap over every partition during the steady span. Latency: from the producer's
timestamp in the event to the command's call, p99 over the calls made during the roll
(``<scenario>_p99_ms``) and the steady span (``<scenario>_steady_p99_ms``). Audit: every identity
sent (and acknowledged) called exactly once, counted from the call files: ``lost``,
``executed_twice`` (summed over the scenarios; a send that failed is left out of both, reported as
``load_failed``).

Last line: one JSON object; ``static_*``/``dynamic_*`` figures are the maxima over the restarts
(None if a restart never resumed), ``*_per_restart`` the lists, and ``target_*`` entries (each
with ``met``): static others stall at most 1 s beyond ``static_steady_max_stall_s``, static
restarted resume <= 5 s, lost 0, executed twice 0. Progress goes to stderr.

Usage: ``python bench/rolling.py [--rate 100] [--partitions 48] [--workers 6]
[--scenarios static,dynamic] [--data-dir DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rolling_app import build  # noqa: E402
from bench.rolling_watch import (  # noqa: E402
    Load,
    Progress,
    load_avg,
    log,
    longest_gap,
    p99,
    read_calls,
    wait_until,
)
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.ops.broker import LocalCluster  # noqa: E402
from streamsched.testing import WorkerProcess  # noqa: E402

HEAP = "-Xmx384m"
BACKLOG_FLAT_S = 30.0
WORKERS: list[WorkerProcess] = []
"""Every worker started, so the outermost ``finally`` can make sure none outlives the bench."""


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def worst(values: list[float | None]) -> float | None:
    """The maximum; None if any is None (a restart that never resumed is not a small figure)."""
    return None if not values or any(v is None for v in values) else max(v for v in values if v is not None)


@dataclass
class Fleet:
    """One scenario's worker slots: slot i's successive processes share its store and instance id."""

    kind: str
    bootstrap: str
    topic: str
    name: str
    workdir: Path
    session_timeout: str | None
    generation: int = 0
    slot_of: dict[int, int] = field(default_factory=dict)
    """pid -> slot of every process started."""

    def start(self, slot: int) -> WorkerProcess:
        self.generation += 1
        env = {"BENCH_TOPIC": self.topic, "BENCH_NAME": self.name,
               "STREAMSCHED_STORE_DIR": str(self.workdir / f"store-w{slot}"),
               "BENCH_CALLS": str(self.workdir / f"calls-w{slot}-{self.generation}.txt")}
        if self.kind == "static":
            env["STREAMSCHED_INSTANCE_ID"] = f"w{slot}"
        if self.session_timeout is not None:
            env["STREAMSCHED_SESSION_TIMEOUT"] = self.session_timeout
        worker = WorkerProcess("bench.rolling_app:app", self.bootstrap, env=env, cwd=ROOT,
                               log_path=self.workdir / f"w{slot}-{self.generation}.log").start()
        WORKERS.append(worker)
        self.slot_of[worker.pid] = slot
        return worker

    async def holdings(self, progress: Progress) -> dict[int, frozenset[int]]:
        """slot -> transition partitions its member holds. By slot, not pid: a static member
        replaced by its successor keeps the client id (so the pid) it first joined with."""
        held: dict[int, frozenset[int]] = {}
        for pid, parts in (await progress.owners()).items():
            if pid in self.slot_of:
                held[self.slot_of[pid]] = held.get(self.slot_of[pid], frozenset()) | parts
        return held


async def restart(slot: int, workers: list[WorkerProcess], fleet: Fleet, progress: Progress,
                  args: argparse.Namespace) -> dict[str, Any]:
    everything = frozenset(range(args.partitions))
    before: dict[int, frozenset[int]] = {}

    async def described() -> bool:
        nonlocal before
        before = await fleet.holdings(progress)
        return slot in before

    await wait_until(described, 30, f"w{slot} in the group's description")
    held = before.get(slot, frozenset())
    t_term = time.time()
    workers[slot].signal(signal.SIGTERM)
    code = await asyncio.to_thread(workers[slot].wait, args.exit_timeout_s)  # SIGKILL past the timeout
    t_exit = time.time()
    workers[slot] = fleet.start(slot)
    t_start = time.time()
    mine: frozenset[int] = frozenset()
    t_seen = t_start

    async def joined() -> bool:
        # Dynamic: the predecessor left, so the slot shows up again once its successor joined and
        # the group is stable (a rebalancing group describes no assignments). Static: the slot
        # never left the group; nobody else may hold its partitions meanwhile.
        nonlocal mine, t_seen
        asked = time.time()
        mine = (await fleet.holdings(progress)).get(slot, frozenset())
        t_seen = asked
        return bool(mine) or not workers[slot].alive()

    deadline = args.resume_deadline_s
    await wait_until(joined, deadline, f"w{slot}'s successor in the group", interval=0.1)
    resumed: dict[int, float | None] = {}

    async def all_resumed() -> bool:
        for p in everything:
            if resumed.get(p) is None:
                resumed[p] = progress.resumed_after(p, t_seen)
        return (bool(mine) and all(resumed[p] is not None for p in everything)) or not workers[slot].alive()

    await wait_until(all_resumed, max(1.0, deadline - (time.time() - t_start)),
                     f"w{slot}'s successor's partitions and every other to advance")
    await asyncio.sleep(args.settle_s)
    t_close = time.time()
    after = await fleet.holdings(progress)
    others = everything - held - mine
    moved = sum(len(parts ^ after.get(s, frozenset())) for s, parts in before.items() if s != slot)
    died = None if workers[slot].alive() else workers[slot].wait(0)
    if died is not None:  # e.g. refused by the group: no resume to measure, and the bench says so
        log(f"w{slot}'s successor exited ({died}):\n{workers[slot].log_tail(5)}")
    resume = None if died is not None else worst([resumed.get(p) for p in mine])
    row = {"slot": f"w{slot}", "exit_code": code, "exit_s": round(t_exit - t_term, 2),
           "held": len(held), "got": len(mine), "same_partitions": mine == held,
           "restarted_resume_s": rounded(resume - t_start if resume is not None and mine else None),
           "others_max_stall_s": rounded(max((longest_gap(progress.advances[p], t_term, t_close)
                                              for p in others), default=None)),
           "restarted_max_stall_s": rounded(max((longest_gap(progress.advances[p], t_term, t_close)
                                                 for p in held), default=None)),
           "others_moved": moved, "successor_exit": died, "window": [round(t_term, 3), round(t_close, 3)],
           "successor_start": round(t_start, 3), "successor_log": str(workers[slot].log_path)}
    log(f"{fleet.kind} restart w{slot}: {row}")
    return row


def boot_s(row: dict[str, Any]) -> float | None:
    """Process start to the worker's metrics being created (interpreter, imports, the app): the
    part of a resume no group protocol can save. From the snapshot a worker prints as it exits."""
    log_path = Path(row.pop("successor_log"))
    with contextlib.suppress(OSError):
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"started_ns"' in line:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    started_ns = int(json.loads(line)["started_ns"])
                    return round(started_ns / 1e9 - float(row["successor_start"]), 2)
    return None


async def scenario(kind: str, bootstrap: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    topic, name = f"roll.{kind}.{tag}", f"roll_{kind}_{tag}"
    sched = build(topic, name).schedulers[name]
    # The internal topics too, before any worker starts: six workers racing to create them would
    # put topic creation into the warm-up, not into a figure, but it is cheaper not to race.
    await apply(bootstrap, [TopicSpec(topic, args.partitions, replication=3),
                            *sched.internal_topics(args.partitions, 3)])
    fleet = Fleet(kind, bootstrap, topic, name, workdir / kind,
                  args.static_session_timeout if kind == "static" else None)
    fleet.workdir.mkdir(parents=True, exist_ok=True)
    workers = [fleet.start(i) for i in range(args.workers)]
    load = Load(bootstrap, topic, args.partitions, args.rate, prefix=f"{kind[0]}{tag}-")
    progress = Progress(bootstrap, sched.group, topic, args.partitions)
    await progress.start()
    load_stop, watch_stop = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(load.run(load_stop)), asyncio.create_task(progress.run(watch_stop))]
    out: dict[str, Any] = {"topic": topic, "load_avg_start": load_avg()}
    try:
        log(f"{kind}: warm-up ({args.workers} workers, {args.partitions} partitions, {args.rate}/s)")

        async def warm() -> bool:
            held = await progress.owners()
            return (all(w.pid in held for w in workers)
                    and set().union(*held.values()) == set(range(args.partitions))
                    and all(progress.advances[p] for p in range(args.partitions)))

        if not await wait_until(warm, args.warmup_timeout_s, "every worker in the group, every partition"):
            raise SystemExit(f"{kind}: warm-up failed; w0's log:\n{workers[0].log_tail(40)}")
        await asyncio.sleep(args.warmup_s)

        def backlog() -> int:
            return len(load.sent) - (sum(progress.samples[-1].offsets.values()) if progress.samples else 0)

        lowest = (backlog(), time.monotonic())

        async def settled() -> bool:
            # The start-up backlog is not steady state: wait until it is down to a second of load,
            # or stopped shrinking (no new low by a second of load for BACKLOG_FLAT_S).
            nonlocal lowest
            if backlog() < lowest[0] - args.rate:
                lowest = (backlog(), time.monotonic())
            return backlog() <= args.rate or time.monotonic() - lowest[1] >= BACKLOG_FLAT_S

        await wait_until(settled, args.warmup_timeout_s, "the start-up backlog to settle")
        out["warmup_backlog_s"] = round(backlog() / args.rate, 1)
        s0 = time.time()
        await asyncio.sleep(args.steady_s)
        s1 = time.time()
        steady = max(longest_gap(progress.advances[p], s0, s1) for p in range(args.partitions))
        log(f"{kind}: steady max gap {steady:.2f}s; rolling")
        restarts = []
        for slot in range(args.workers):
            restarts.append(await restart(slot, workers, fleet, progress, args))
        r1 = time.time()
        load_stop.set()
        log(f"{kind}: roll done; draining {len(load.sent)} identities")

        async def drained() -> bool:
            called = read_calls(fleet.workdir.glob("calls-*.txt")).per_identity
            return all(run_id in called for run_id in load.sent)

        await wait_until(drained, args.drain_timeout_s, "every identity sent to be called", interval=2)
    finally:
        load_stop.set()
        watch_stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await progress.stop()
        await stop_workers(workers)
    for row in restarts:
        row["successor_boot_s"] = boot_s(row)
    calls = read_calls(fleet.workdir.glob("calls-*.txt"))
    counted = calls.per_identity
    sent_or_failed = load.sent | load.failed
    out.update({
        "steady_max_stall_s": round(steady, 2),
        "p99_ms": p99(calls.latencies_ms(restarts[0]["window"][0], r1)),
        "steady_p99_ms": p99(calls.latencies_ms(s0, s1)),
        "restarts": restarts, "sent": len(load.sent), "load_failed": len(load.failed),
        "lost": sum(1 for run_id in load.sent if run_id not in counted),
        "executed_twice": sum(1 for n in counted.values() if n > 1),
        "calls": sum(counted.values()),
        "calls_not_sent": sum(1 for run_id in counted if run_id not in sent_or_failed),
        "exit_codes": [w.proc.returncode if w.proc else None for w in workers],
        "load_avg_end": load_avg()})
    return out


async def stop_workers(workers: list[WorkerProcess]) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    await asyncio.gather(*(asyncio.to_thread(w.wait, 60) for w in workers))


def judge(result: dict[str, Any]) -> None:
    static_excess = (None if result.get("static_others_max_stall_s") is None else
                     round(result["static_others_max_stall_s"] - result["static"]["steady_max_stall_s"], 2))
    targets: dict[str, tuple[float | None, float]] = {
        "static_others_stall_beyond_steady_s": (static_excess, 1.0),
        "static_restarted_resume_s": (result.get("static_restarted_resume_s"), 5.0),
        "lost": (result["lost"], 0), "executed_twice": (result["executed_twice"], 0)}
    for key, (value, limit) in targets.items():
        result[f"target_{key}"] = {"value": value, "limit": limit,
                                   "met": value is not None and value <= limit}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.data_dir or tempfile.mkdtemp(prefix="rolling-"))
    log(f"data in {workdir}; load average {load_avg()}")
    member = (ROOT / "streamsched/kafka/member.py").read_text()
    result: dict[str, Any] = {"settings": {
        "partitions": args.partitions, "workers": args.workers, "rate_per_s": args.rate, "nodes": 3,
        "replication": 3, "heap": HEAP, "static_session_timeout": args.static_session_timeout,
        "dynamic_session_timeout": "10s (default)", "settle_s": args.settle_s,
        "assignment": ("co-partitioned sticky (streamsched/kafka/assignor.py)" if "assignors()" in member
                       else "range (aiokafka)"),
        "transactions": os.environ.get("STREAMSCHED_TRANSACTIONS", "worker (the default)")},
        "load_avg_start": load_avg()}
    try:
        async with LocalCluster(data_dir=workdir / "cluster", nodes=3, heap=HEAP) as cluster:
            for kind in args.scenarios:
                result[kind] = await scenario(kind, cluster.bootstrap, workdir, args)
    finally:
        for w in WORKERS:
            if w.alive():
                w.kill()
    steady = []
    for kind in args.scenarios:
        r = result[kind]
        steady.append(r["steady_max_stall_s"])
        for key in ("others_max_stall_s", "restarted_resume_s", "restarted_max_stall_s", "successor_boot_s"):
            values = [row[key] for row in r["restarts"]]
            result[f"{kind}_{key}"], result[f"{kind}_{key}_per_restart"] = worst(values), values
        for key in ("p99_ms", "steady_p99_ms", "steady_max_stall_s"):
            result[f"{kind}_{key}"] = r[key]
        for key in ("others_moved", "successor_exit"):
            result[f"{kind}_{key}_per_restart"] = [row[key] for row in r["restarts"]]
        result[f"{kind}_warmup_backlog_s"] = r["warmup_backlog_s"]
    result["steady_max_stall_s"] = max(steady)
    for key in ("lost", "executed_twice", "load_failed", "calls_not_sent"):
        result[key] = sum(result[kind][key] for kind in args.scenarios)
    if "static" in args.scenarios:
        judge(result)
    result["load_avg_end"] = load_avg()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=100.0, help="new identities per second")
    ap.add_argument("--partitions", type=int, default=48)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--scenarios", default="static,dynamic", help="comma-separated: static, dynamic")
    ap.add_argument("--static-session-timeout", default="30s")
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--warmup-timeout-s", type=float, default=240.0)
    ap.add_argument("--steady-s", type=float, default=20.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--exit-timeout-s", type=float, default=60.0, help="SIGKILL a stopping worker past this")
    ap.add_argument("--resume-deadline-s", type=float, default=120.0)
    ap.add_argument("--drain-timeout-s", type=float, default=180.0)
    ap.add_argument("--data-dir", help="keep the cluster, call files and worker logs here")
    args = ap.parse_args(argv)
    args.scenarios = [k for k in args.scenarios.split(",") if k]
    if not args.scenarios or set(args.scenarios) - {"static", "dynamic"}:
        ap.error("--scenarios takes static and/or dynamic")
    return args


def interrupt(signum: int, frame: object) -> None:
    """A SIGTERM to the bench unwinds like Ctrl-C, so its finally blocks stop workers and brokers."""
    raise KeyboardInterrupt


def cli() -> None:
    args = parse()
    signal.signal(signal.SIGTERM, interrupt)
    print(json.dumps(asyncio.run(main(args))), flush=True)


if __name__ == "__main__":
    cli()
