"""The scheduler bench/io_bound.py runs in a worker process
(``streamsched run --app bench.io_bound_app:app``).

One external command that only waits, as a call to a slow service does: ``BENCH_LATENCY`` is
``const`` (every call waits ``BENCH_MEDIAN_MS``) or ``lognormal`` (median ``BENCH_MEDIAN_MS``,
99th percentile ``BENCH_P99_MS``). The wait of an item is drawn from its identity, so every run
of a workload sees the same latencies in the same places.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import random
from statistics import NormalDist

from streamsched import App, CommandContext, Selection, Turn, external_command

Z99 = NormalDist().inv_cdf(0.99)


def latency_s(kind: str, identity: str, median_ms: float, p99_ms: float) -> float:
    """One call's wait: constant, or lognormal with the given median and 99th percentile."""
    if kind == "const":
        return median_ms / 1000
    sigma = math.log(p99_ms / median_ms) / Z99
    seed = int.from_bytes(hashlib.blake2b(identity.encode(), digest_size=8).digest(), "big")
    return median_ms / 1000 * math.exp(sigma * random.Random(seed).gauss(0.0, 1.0))


def mean_latency_s(kind: str, median_ms: float, p99_ms: float) -> float:
    """The mean of that distribution (the bound's denominator, by Little's law)."""
    if kind == "const":
        return median_ms / 1000
    sigma = math.log(p99_ms / median_ms) / Z99
    return median_ms / 1000 * math.exp(sigma * sigma / 2)


def build(topic: str, name: str, kind: str, median_ms: float, p99_ms: float) -> App:
    app = App("io_bound")

    @external_command()
    async def call_service(ctx: CommandContext, *, ref: str) -> None:
        await asyncio.sleep(latency_s(kind, ctx.idempotency_key, median_ms, p99_ms))

    async def handle(turn: Turn) -> None:
        await turn.commands.call_service(ref=turn.event.target[0])

    app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[call_service],
                  claim_duration_s=30)(handle)
    return app


app = build(os.environ.get("BENCH_TOPIC", "bench"), os.environ.get("BENCH_NAME", "bench"),
            os.environ.get("BENCH_LATENCY", "const"), float(os.environ.get("BENCH_MEDIAN_MS", "20")),
            float(os.environ.get("BENCH_P99_MS", "200")))
