"""CPU of the worker's turn alone: bench/turns.py's Kafka-native scheduler over the in-memory Kafka.

No broker, no network, no claim store on disk: one partition's :class:`TurnRunner` takes
``--records`` records in batches of ``max_in_flight`` (8), as the partition loop does under
load, then flushes. The figure is the process CPU per item (``time.process_time``) of that
loop, which includes the in-memory Kafka's own bookkeeping (about what aiokafka's record
building costs). It moves with the machine's load far less than an end-to-end run, so it is the
A/B for a change to the hot path: run it on both commits, alternated, and compare the medians.

Usage: ``python bench/turn_cpu.py [--records N] [--rounds R]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.turns_app import scheduler
from streamsched.metrics import Metrics
from streamsched.model.identity import route_key
from streamsched.testing import make_event
from streamsched.testing.fakes import FakeKafka
from streamsched.wire.transition import encode_transition
from streamsched.worker.store import PartitionState
from streamsched.worker.turn import TurnRunner


async def one_round(records: int, tag: int) -> float:
    """Process CPU ms per item of one fresh partition taking ``records`` records."""
    kafka = FakeKafka()
    s = scheduler("native", "in", f"bench{tag}", "out")
    for topic in ("in", "out", s.state_topic, s.dead_letter_topic, s.delay_topic):
        kafka.create_topic(topic)
    recs = []
    for i in range(records):
        ev = make_event("due", f"t{i % 7}", [f"item-{i}"], due_ns=i)
        key = route_key(ev.tenant, ev.target)
        recs.append(kafka.produce("in", encode_transition(ev), partition=0, key=key))
    producer = kafka.producer(f"bench{tag}.0")
    await producer.start()
    runner = TurnRunner(s, 0, producer, PartitionState(0), owner="bench", metrics=Metrics("bench"),
                        partitions=1, commit_interval_s=0.1)
    assert runner.native is not None
    runner.native.careful = None  # a worker's steady state: past its first, claim-first batch
    size = s.max_in_flight
    t0 = time.process_time()
    for i in range(0, records, size):
        await runner.step(runner.prepare(recs[i:i + size]))
    await runner.step(None, flush_offsets=True)
    return (time.process_time() - t0) * 1000 / records


async def main(records: int, rounds: int) -> dict[str, object]:
    await one_round(min(records, 2000), -1)  # warm-up
    cpu = [await one_round(records, r) for r in range(rounds)]
    return {"records": records, "rounds": rounds, "turn_cpu_ms_per_item": round(statistics.median(cpu), 4),
            "turn_cpu_ms_per_item_range": [round(min(cpu), 4), round(max(cpu), 4)],
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=16_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.records, args.rounds))))
