"""A group-wide rate limit held across workers and a rebalance: calls per 10-second window.

Three worker processes (``streamsched run --app bench.breaker_app:app`` with ``BENCH_RATE``) run one
scheduler over ``--partitions`` (12) partitions whose external command calls a fake downstream (an
HTTP server in this process that answers 200 and notes when each call came). The command has
``rate=--rate`` (200 calls per second), the whole group's budget: each worker paces the share of
the partitions it owns. A backlog of ``--items`` events is produced first, far more than the run
can call, so the limit is what holds the rate. Midway one worker is stopped (SIGTERM: it drains
and leaves), so the group rebalances and the two left re-divide the budget.

The calls are counted in consecutive 10-second windows from the first call; the first window
(the workers starting, joining and restoring) is left out, as is the last partial one.

Keys of the JSON on the last line: ``max_window_ratio`` and ``min_window_ratio`` (calls in a
window over ``rate x 10``), ``windows`` (each window's ratio), ``rate``, ``calls``,
``rebalance_at_s`` (seconds after the first call). Target: every window within 0.9..1.1.

Usage: ``python bench/rate_limit.py [--bootstrap HOST:PORT] [--rate R] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.breaker import Downstream  # noqa: E402
from bench.turns import log, run_on_broker, tag  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.testing import WorkerProcess, make_event, produce_events  # noqa: E402

WINDOW_S = 10.0


def windows(times: list[float], start: float, end: float) -> list[int]:
    """Calls in each whole window of ``WINDOW_S`` from ``start`` up to ``end``."""
    n = int((end - start) // WINDOW_S)
    counts = [0] * n
    for t in times:
        i = int((t - start) // WINDOW_S)
        if 0 <= i < n:
            counts[i] += 1
    return counts


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    down = Downstream(up=True)
    url = await down.start()
    name, topic = f"rl-{tag()}", f"rl-in-{tag()}"
    await apply(bootstrap, [TopicSpec(topic, args.partitions)])
    items = args.items or int(args.rate * args.seconds * 1.5)
    async with Producer(bootstrap, linger_ms=5) as producer:
        for start in range(0, items, 5000):
            await produce_events(producer, topic, [make_event("due", f"t{i % 7}", [f"item-{i}"])
                                                   for i in range(start, min(items, start + 5000))])
    log(f"{items} items produced; starting 3 workers at rate {args.rate}/s")
    env = {"BENCH_TOPIC": topic, "BENCH_NAME": name, "BENCH_URL": url, "BENCH_BREAKER": "0",
           "BENCH_RATE": str(args.rate)}
    workers = [WorkerProcess("bench.breaker_app:app", bootstrap,
                             env={**env, "STREAMSCHED_STORE_DIR": str(logdir / f"stores-{i}")},
                             log_path=logdir / f"{name}-{i}.log").start() for i in range(3)]
    try:
        deadline = time.monotonic() + 120
        while not down.times and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not down.times:
            raise RuntimeError("no call in 120 s")
        first = down.times[0]
        await asyncio.sleep(max(0.0, first + args.seconds / 2 - time.monotonic()))
        rebalance_at = time.monotonic() - first
        log(f"stopping one worker at {rebalance_at:.1f} s: the group rebalances")
        await asyncio.to_thread(workers[0].terminate, 60)
        await asyncio.sleep(max(0.0, first + args.seconds - time.monotonic()))
        end = time.monotonic()
    finally:
        for w in workers[1:]:
            await asyncio.to_thread(w.terminate, 60)
        await down.stop()
    counts = windows(down.times, first, end)
    ratios = [round(c / (args.rate * WINDOW_S), 3) for c in counts[1:]]
    log(f"windows: {ratios}")
    return {"rate": args.rate, "partitions": args.partitions, "calls": len(down.times),
            "rebalance_at_s": round(rebalance_at, 1), "windows": ratios,
            "max_window_ratio": max(ratios), "min_window_ratio": min(ratios)}


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--broker-pid", type=int, default=None)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=90.0, help="run length from the first call")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--items", type=int, default=0, help="backlog (default: 1.5 x rate x seconds)")
    args = ap.parse_args()
    print(json.dumps(run_on_broker(main, args, prefix="bench-rate-")))


if __name__ == "__main__":
    cli()
