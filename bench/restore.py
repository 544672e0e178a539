"""Benchmark of the disk-backed claim store: memory, cold restore and warm restart at scale.

Seeds N claim snapshots (resolved just now, so the outcome horizon keeps them all) across the
8 partitions of a scheduler's state topic with a raw producer, then runs ``streamsched run`` on
that scheduler (a real process, ``--store-dir``, an empty transition topic) and measures:

* ``cold_restore_s``: a worker with an empty store directory restores every partition from the
  changelog; the slowest partition's ``restore_seconds`` (the 8 restore at once, so this is the
  restore phase's wall time). ``cold_ready_s``: process start to ``/readyz``.
* ``raw_read_s``: one raw aiokafka consumer (read_committed, as restores read) reading the same
  8 partitions from the beginning to their end, doing nothing with the records: the floor.
* ``ratio_restore_to_raw`` = raw_read_s / cold_restore_s (1.0: restoring costs nothing more).
* ``rss_mb``: the worker's resident memory once restored and running (``rss_peak_mb``: VmHWM).
* ``warm_restart_s``: SIGTERM, then a new process on the same store, start to ``/readyz``.
* ``load_avg``: the machine's 1-minute load average when the rounds start and when they end
  (the figures above are only comparable between runs under similar load).

Every figure is the median of ``--rounds`` rounds (the range is printed too) after a warm-up
round that is not counted. Usage::

    python bench/restore.py [--bootstrap HOST:PORT] [--identities 1000000] [--rounds 3]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.ops.broker import LocalCluster, free_port
from streamsched.testing import WorkerProcess
from streamsched.wire.claim import encode_claim

PARTITIONS = 8
NAME_ENV = "STREAMSCHED_BENCH_RESTORE_NAME"

# --- the app the worker process runs (``bench.restore:app``) ----------------------------------------

def build_app(name: str) -> App:
    bench = App("bench")

    @external_command()
    async def noop(ctx: CommandContext) -> None:
        return None

    @bench.scheduler(name=name, topic=f"{name}.transitions", selection=Selection("due", type="due"),
                     commands=[noop])
    async def handle(turn: Turn) -> None:
        await turn.commands.noop()

    return bench


app = build_app(os.environ.get(NAME_ENV, "restore_bench"))


# --- seeding and the raw baseline ------------------------------------------------------------------------

async def seed(bootstrap: str, topic: str, n: int) -> float:
    """``n`` resolved snapshots, round-robin over the partitions, one record batch at a time."""
    producer = clients.producer(bootstrap, max_batch_size=1 << 20, max_request_size=4 << 20, linger_ms=20)
    await producer.start()
    t0 = time.perf_counter()
    now = time.time_ns()
    try:
        futures = []
        for p in range(PARTITIONS):
            batch = producer.create_batch()
            for i in range(p, n, PARTITIONS):
                identity = "sched_" + hashlib.sha256(b"%d" % i).hexdigest()
                value = encode_claim(ClaimState(identity, ClaimStatus.RELEASED, "", 1, 0, 1, 3,
                                                Outcome(OutcomeKind.SUCCEEDED, 1, now)))
                if batch.append(key=identity.encode(), value=value, timestamp=None) is None:
                    futures.append(await producer.send_batch(batch, topic, partition=p))
                    batch = producer.create_batch()
                    batch.append(key=identity.encode(), value=value, timestamp=None)
            futures.append(await producer.send_batch(batch, topic, partition=p))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - t0


async def raw_read(bootstrap: str, topic: str) -> float:
    """Seconds for one consumer to read every partition of ``topic`` to its end."""
    from aiokafka import TopicPartition

    consumer = clients.consumer(bootstrap, max_partition_fetch_bytes=4 << 20, fetch_max_bytes=8 << 20)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        t0 = time.perf_counter()
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        left = set(tps)
        while left:
            await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp in list(left):
                if await consumer.position(tp) >= end[tp]:
                    left.discard(tp)
        return time.perf_counter() - t0
    finally:
        await consumer.stop()


# --- the worker process --------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), resp.read().decode()
    except OSError:
        return 0, ""


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


class Run:
    """One ``streamsched run`` process on the bench scheduler and a store directory."""

    def __init__(self, bootstrap: str, name: str, store: Path, log: Path) -> None:
        self.port = free_port()
        self.proc = WorkerProcess("bench.restore:app", bootstrap, log_path=log, env={
            NAME_ENV: name, "STREAMSCHED_LOG": "INFO"},
            command=["run", "--app", "bench.restore:app", "--store-dir", str(store),
                     "--status-port", str(self.port)])

    async def start_until_ready(self, timeout: float = 600.0) -> float:
        t0 = time.perf_counter()
        self.proc.start()
        url = f"http://127.0.0.1:{self.port}/readyz"
        while time.perf_counter() - t0 < timeout:
            code, _ = await asyncio.to_thread(_get, url)
            if code == 200:
                return time.perf_counter() - t0
            if not self.proc.alive():
                raise RuntimeError("the worker exited before it was ready (see its log)")
            await asyncio.sleep(0.02)
        raise TimeoutError("the worker was not ready in time")

    def restore_seconds(self) -> float:
        """The slowest partition's restore (they run at the same time)."""
        _, text = _get(f"http://127.0.0.1:{self.port}/metrics")
        sums = [float(m.group(1)) for m in re.finditer(
            r'^streamsched_restore_seconds_sum\{[^}]*\} ([0-9.e+-]+)$', text, re.M)]
        if len(sums) != PARTITIONS:
            raise RuntimeError(f"expected {PARTITIONS} restore_seconds series, found {len(sums)}")
        return max(sums)

    def stop(self) -> None:
        code = self.proc.terminate(60)
        if code != 0:
            raise RuntimeError(f"the worker exited with {code}")


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


async def main(bootstrap: str, identities: int, rounds: int, workdir: Path) -> dict[str, Any]:
    name = f"restore_bench_{uuid.uuid4().hex[:8]}"
    s = build_app(name).schedulers[name]
    await apply(bootstrap, [TopicSpec(s.topic, PARTITIONS, 1),
                            TopicSpec(s.state_topic, PARTITIONS, 1, kind="state")])
    seed_s = await seed(bootstrap, s.state_topic, identities)
    print(f"seeded {identities} identities in {seed_s:.1f}s", file=sys.stderr)

    load_start = os.getloadavg()[0]
    raw: list[float] = []
    cold: list[float] = []
    cold_ready: list[float] = []
    rss: list[float] = []
    peak: list[float] = []
    for i in range(rounds + 1):  # round 0 warms up the broker's page cache and the interpreter
        raw_s = await raw_read(bootstrap, s.state_topic)
        store = workdir / f"store-{i}"
        shutil.rmtree(store, ignore_errors=True)
        run = Run(bootstrap, name, store, workdir / f"cold-{i}.log")
        ready_s = await run.start_until_ready()
        restore_s = run.restore_seconds()
        await asyncio.sleep(2.0)  # running, idle: what it holds after the restore
        now_mb, peak_mb = rss_mb(run.proc.pid)
        run.stop()
        print(f"round {i}: raw {raw_s:.2f}s cold restore {restore_s:.2f}s ready {ready_s:.2f}s "
              f"rss {now_mb:.0f} MB (peak {peak_mb:.0f})", file=sys.stderr)
        if i:
            raw.append(raw_s)
            cold.append(restore_s)
            cold_ready.append(ready_s)
            rss.append(now_mb)
            peak.append(peak_mb)

    warm: list[float] = []
    store = workdir / f"store-{rounds}"
    for i in range(rounds + 1):
        run = Run(bootstrap, name, store, workdir / f"warm-{i}.log")
        ready_s = await run.start_until_ready()
        run.stop()
        print(f"warm restart {i}: ready in {ready_s:.2f}s", file=sys.stderr)
        if i:
            warm.append(ready_s)

    raw_s, cold_s = statistics.median(raw), statistics.median(cold)
    return {
        "identities": identities,
        "partitions": PARTITIONS,
        "rss_mb": round(statistics.median(rss), 1),
        "rss_peak_mb": round(statistics.median(peak), 1),
        "cold_restore_s": round(cold_s, 3),
        "cold_ready_s": round(statistics.median(cold_ready), 3),
        "raw_read_s": round(raw_s, 3),
        "ratio_restore_to_raw": round(raw_s / cold_s, 3),
        "warm_restart_s": round(statistics.median(warm), 3),
        "rounds": rounds,
        "range": {"cold_restore_s": spread(cold), "raw_read_s": spread(raw), "warm_restart_s": spread(warm),
                  "rss_mb": spread(rss)},
        "seed_s": round(seed_s, 1),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--identities", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        if args.bootstrap:
            result = asyncio.run(main(args.bootstrap, args.identities, args.rounds, Path(tmp)))
        else:
            cluster = LocalCluster(data_dir=Path(tmp) / "kafka")
            bootstrap = cluster.start()
            try:
                result = asyncio.run(main(bootstrap, args.identities, args.rounds, Path(tmp)))
            finally:
                cluster.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    cli()
