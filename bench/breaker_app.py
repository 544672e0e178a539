"""The scheduler bench/breaker.py runs in a worker process
(``streamsched run --app bench.breaker_app:app``).

One external command that calls a fake downstream over HTTP (``BENCH_URL``, served by the
benchmark itself): a 503 answer is a transient failure (``Retryable``), a 200 a success. The
command carries a circuit breaker unless ``BENCH_BREAKER=0`` (the baseline), and a group-wide
rate limit of ``BENCH_RATE`` calls per second if set (bench/rate_limit.py).
"""

from __future__ import annotations

import os

import aiohttp

from streamsched import App, BreakerPolicy, CommandContext, Retryable, Selection, Turn, external_command

URL = os.environ.get("BENCH_URL", "http://127.0.0.1:1/")
BREAKER = BreakerPolicy(failure_ratio=0.5, window_s=10, minimum_calls=20, open_s=30.0, half_open_calls=3)
_session: aiohttp.ClientSession | None = None


def _client() -> aiohttp.ClientSession:
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    return _session


def build(topic: str, name: str, breaker: bool, rate: float | None = None) -> App:
    app = App("breaker")

    @external_command(breaker=BREAKER if breaker else None, rate=rate)
    async def charge(ctx: CommandContext) -> None:
        async with _client().post(URL, json={"key": ctx.idempotency_key, "attempt": ctx.attempt}) as r:
            if r.status == 503:
                raise Retryable("the downstream is unavailable")
            r.raise_for_status()

    async def handle(turn: Turn) -> None:
        await turn.commands.charge()

    app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[charge],
                  claim_duration_s=30)(handle)
    return app


app = build(os.environ.get("BENCH_TOPIC", "bench"), os.environ.get("BENCH_NAME", "bench"),
            os.environ.get("BENCH_BREAKER", "1") != "0",
            float(os.environ["BENCH_RATE"]) if os.environ.get("BENCH_RATE") else None)
