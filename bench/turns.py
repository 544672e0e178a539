"""Benchmark of the worker turn against two baselines, in one run on one local broker.

B1  raw aiokafka: consume + commit per fetched batch (no claims, no state) — the ceiling.
B2  a hand-written serial loop per record: claim (acks=all) -> no-op -> outcome (acks=all) ->
    commit offset — what a careful user writes without streamsched.
P1  streamsched, 1 partition, a no-op external command.
P8  streamsched, 8 partitions, a no-op external command.

Usage: ``python bench/turns.py [--bootstrap HOST:PORT] [--records N]``; the last line printed is
one JSON object with throughputs, ratios, turn latency percentiles and CPU per 1k records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.metrics import Metrics
from streamsched.ops.broker import LocalCluster
from streamsched.testing import make_event, produce_events, wait_drained
from streamsched.wire.transition import encode_transition
from streamsched.worker.intake import Worker, WorkerConfig


async def make_topic(bootstrap: str, partitions: int, n: int) -> str:
    topic = f"bench-{partitions}p-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(topic, partitions)])
    events = [make_event("due", f"t{i % 7}", [f"item-{i}"], due_ns=i) for i in range(n)]
    await produce_events(bootstrap, topic, events)
    return topic


async def b1_raw(bootstrap: str, topic: str, n: int) -> float:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"b1-{uuid.uuid4().hex[:6]}",
                         enable_auto_commit=False, auto_offset_reset="earliest",
                         isolation_level="read_committed")
    await c.start()
    try:
        while not c.assignment():
            await c.getmany(timeout_ms=50, max_records=1)
            c.seek_to_beginning()
        # Timed from the first fetch after assignment, so the first batch counts too.
        t0 = time.perf_counter()
        seen = 0
        while seen < n:
            batch = await c.getmany(timeout_ms=500, max_records=500)
            seen += sum(len(v) for v in batch.values())
            if batch:
                await c.commit()
        return n / (time.perf_counter() - t0)
    finally:
        await c.stop()


async def b2_serial(bootstrap: str, topic: str, n: int) -> float:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    state = f"b2-state-{uuid.uuid4().hex[:6]}"
    await apply(bootstrap, [TopicSpec(state, 1, kind="state")])
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0)
    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"b2-{uuid.uuid4().hex[:6]}",
                         enable_auto_commit=False, auto_offset_reset="earliest",
                         isolation_level="read_committed")
    await p.start()
    await c.start()
    try:
        done = 0
        t0 = None
        while done < n:
            batch = await c.getmany(timeout_ms=500, max_records=1)
            for tp, records in batch.items():
                for rec in records:
                    if t0 is None:
                        t0 = time.perf_counter()
                    key = rec.key or b""
                    await p.send_and_wait(state, b"claim", key=key)
                    await p.send_and_wait(state, b"outcome+release", key=key)
                    await c.commit({TopicPartition(tp.topic, tp.partition): rec.offset + 1})
                    done += 1
        assert t0 is not None
        return n / (time.perf_counter() - t0)
    finally:
        await c.stop()
        await p.stop()


async def streamsched_run(bootstrap: str, topic: str, n: int) -> tuple[float, Metrics, float]:
    app = App("bench")

    @external_command()
    async def noop(ctx: CommandContext) -> None:
        return None

    name = f"bench{uuid.uuid4().hex[:6]}"

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[noop],
                   claim_duration_s=30)
    async def handle(turn: Turn) -> None:
        await turn.commands.noop()

    sched = app.schedulers[name]
    worker = Worker(sched, WorkerConfig(bootstrap=bootstrap))
    await worker.ensure_topics()
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    # Time from the first claim to the drained group: excludes group join and restore.
    while worker.metrics.counters.get("claims", 0) == 0:
        if task.done():
            await task
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    # "committed" counts items whose outcome and release transaction committed (durable); a
    # metrics read is free, unlike polling the group's offsets, which would bill its own CPU.
    while worker.metrics.counters.get("committed", 0) < n:
        if task.done():
            await task
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await wait_drained(bootstrap, sched.group, topic, timeout=120)  # offsets follow within 0.2 s
    stop.set()
    await task
    done = worker.metrics.counters.get("committed", 0)
    return done / elapsed, worker.metrics, cpu / (done / 1000)


async def main(bootstrap: str, records: int) -> dict[str, object]:
    # Warm the broker's JIT and page cache first, so no contender is measured against a cold JVM.
    await b2_serial(bootstrap, await make_topic(bootstrap, 1, 200), 200)
    await streamsched_run(bootstrap, await make_topic(bootstrap, 8, 1000), 1000)
    t_b1 = await make_topic(bootstrap, 8, records)
    t_b2 = await make_topic(bootstrap, 1, max(200, records // 10))
    t_p1 = await make_topic(bootstrap, 1, records)
    t_p8 = await make_topic(bootstrap, 8, records)
    b1 = await b1_raw(bootstrap, t_b1, records)
    b2 = await b2_serial(bootstrap, t_b2, max(200, records // 10))
    p1, _, _ = await streamsched_run(bootstrap, t_p1, records)
    p8, m8, cpu_per_1k = await streamsched_run(bootstrap, t_p8, records)
    return {
        "records": records,
        "b1_per_s": round(b1, 1),
        "b2_per_s": round(b2, 1),
        "p1_per_s": round(p1, 1),
        "p8_per_s": round(p8, 1),
        "ratio_p8_to_b1": round(p8 / b1, 3),
        "ratio_p8_to_b2": round(p8 / b2, 2),
        "p50_ms": round(m8.percentile("turn_ms", 0.50) or 0.0, 2),
        "p99_ms": round(m8.percentile("turn_ms", 0.99) or 0.0, 2),
        "cpu_s_per_1k": round(cpu_per_1k, 3),
        "max_in_flight": 8,
        "encoded_event_bytes": len(encode_transition(make_event("due", "t0", ["item-0"]))),
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--records", type=int, default=4000)
    args = ap.parse_args()
    if args.bootstrap:
        result = asyncio.run(main(args.bootstrap, args.records))
    else:
        with tempfile.TemporaryDirectory(prefix="streamsched-bench-") as tmp:
            cluster = LocalCluster(data_dir=Path(tmp))
            try:
                result = asyncio.run(main(cluster.start(), args.records))
            finally:
                cluster.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    cli()
