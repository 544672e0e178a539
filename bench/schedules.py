"""Benchmark: 1,000 schedules ``@every 1s`` fired by one ticker process on the local broker.

A read_committed consumer in the same process records, for every occurrence, how long after its
planned time it became visible (committed). The last line printed is one JSON object:
occurrences, duplicates, fired_within_100ms_pct, lateness_p50_ms, lateness_p99_ms, plus the
ticker's CPU seconds per 1,000 occurrences.

Usage: ``python bench/schedules.py [--bootstrap HOST:PORT] [--schedules N] [--seconds S]``
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import fastavro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import LocalCluster
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker, TickerConfig
from streamsched.wire.avro_schema import parsed_schema


async def main(bootstrap: str, schedules: int, seconds: float) -> dict[str, object]:
    schema = parsed_schema("transition")

    catalog = Catalog(bootstrap, f"bench-{uuid.uuid4().hex[:6]}", partitions=4)
    await catalog.ensure_topics()
    target = f"bench-occ-{uuid.uuid4().hex[:6]}"
    await apply(bootstrap, [TopicSpec(target, 4)])
    await catalog.schedule_many([{"name": f"s{i:04d}", "spec": "@every 1s", "target": target}
                                 for i in range(schedules)])
    consumer = clients.consumer(bootstrap, target)  # read_committed, earliest, no group
    await consumer.start()
    ticker = Ticker(catalog, TickerConfig(bootstrap=bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(ticker.run(stop))
    lateness: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    warmup_until = time.time_ns() + 5 * 10**9  # group join, restore, first catch-up
    end = time.monotonic() + seconds + 5
    cpu0: float | None = None
    fired0 = 0
    while time.monotonic() < end:
        batch = await consumer.getmany(timeout_ms=100)
        now = time.time_ns()
        if cpu0 is None and now >= warmup_until:
            cpu0, fired0 = time.process_time(), ticker.metrics.counters.get("occurrences_fired", 0)
        for records in batch.values():
            for rec in records:
                # The measuring consumer shares the ticker's CPU: read only the two fields it
                # needs, without the validating decoder (tests cover that one).
                ev = fastavro.schemaless_reader(io.BytesIO(rec.value[2:]), schema, None)
                event_id, due_ns = ev["event_id"], ev["due_ns"]
                if event_id in seen:
                    duplicates += 1
                seen.add(event_id)
                if due_ns >= warmup_until:
                    lateness.append((now - due_ns) / 1e6)
    cpu = time.process_time() - (cpu0 or 0.0)
    fired = ticker.metrics.counters.get("occurrences_fired", 0) - fired0
    stop.set()
    await task
    await consumer.stop()
    lateness.sort()

    def pct(q: float) -> float:
        return round(lateness[min(len(lateness) - 1, int(q * len(lateness)))], 2) if lateness else -1.0

    return {
        "schedules": schedules,
        "seconds": seconds,
        "occurrences": len(seen),
        "measured": len(lateness),
        "duplicates": duplicates,
        "fired_within_100ms_pct": round(100 * sum(x <= 100 for x in lateness) / max(1, len(lateness)), 2),
        "lateness_p50_ms": pct(0.5),
        "lateness_p99_ms": pct(0.99),
        "lateness_max_ms": round(lateness[-1], 2) if lateness else -1.0,
        "ticker_commit_p50_ms": round(ticker.metrics.percentile("commit_after_planned_ms", 0.5) or -1, 2),
        "ticker_commit_p99_ms": round(ticker.metrics.percentile("commit_after_planned_ms", 0.99) or -1, 2),
        "end_txn_p50_ms": round(ticker.metrics.percentile("end_txn_ms", 0.5) or -1, 2),
        "late_plans": ticker.metrics.counters.get("late_plans", 0),
        "cpu_s_per_1k_occurrences": round(cpu / max(1, fired) * 1000, 3),
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--schedules", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    if args.bootstrap:
        result = asyncio.run(main(args.bootstrap, args.schedules, args.seconds))
    else:
        with tempfile.TemporaryDirectory(prefix="streamsched-bench-") as tmp:
            cluster = LocalCluster(data_dir=Path(tmp))
            try:
                result = asyncio.run(main(cluster.start(), args.schedules, args.seconds))
            finally:
                cluster.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    cli()
