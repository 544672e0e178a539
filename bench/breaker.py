"""A downstream outage under a circuit breaker: dead letters, calls made during it, exactly once.

A fake downstream (an HTTP server in this process) answers every call with 503 for
``--outage-s`` (300) seconds while ``--items`` (10,000) events arrive at a steady rate, then
answers 200. One worker process (``streamsched run --app bench.breaker_app:app``, ``--partitions``
8) runs a scheduler whose external command calls it, with a circuit breaker (failure ratio 0.5 over
10 s, at least 20 calls, open 30 s, 3 probes) and the default retry policy (5 attempts). After the
outage the benchmark waits until the group has committed everything (transition and delay topics)
and every item was answered 200.

Measured from outside the worker: the downstream's log of calls (idempotency key, time, answer)
and the scheduler's dead-letter topic (read_committed).

Keys of the JSON on the last line: ``outage_dead_letters`` (records on the dead-letter topic),
``outage_calls`` and ``outage_calls_ratio`` (calls answered 503, over the items),
``executed_once`` (every item answered 200 exactly once), ``items``, ``succeeded``,
``max_successes_per_item``, ``recovery_s`` (from the end of the outage until everything is
committed), ``breaker_opened``. ``--baseline`` also runs the same outage without a breaker
first and adds ``baseline_dead_letters`` and ``baseline_calls``.

Targets: 0 dead letters caused by the outage, every item executed exactly once after recovery,
calls during the outage <= 1 % of the items.

Usage: ``python bench/breaker.py [--bootstrap HOST:PORT] [--items N] [--outage-s S] [--baseline]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turns import log, run_on_broker, tag  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.kafka.reads import read_topic  # noqa: E402
from streamsched.model.names import internal_topic  # noqa: E402
from streamsched.ops.broker import free_port  # noqa: E402
from streamsched.ops.status.client import fetch_status  # noqa: E402
from streamsched.testing import WorkerProcess, make_event, produce_events, wait_drained, wait_for  # noqa: E402


async def _ready(url: str) -> bool:
    try:
        doc = await fetch_status(url)
    except Exception:  # noqa: BLE001 - not serving yet
        return False
    return bool(doc.get("ready")) and any(
        s.get("gauges", {}).get("partitions", 0) > 0 for s in doc.get("schedulers", []))


@dataclass
class Downstream:
    """Answers 503 while down, 200 when up; logs every call."""

    up: bool = False
    calls_down: int = 0
    successes: Counter[str] = field(default_factory=Counter)
    times: list[float] = field(default_factory=list)
    """When each successful call came (monotonic seconds)."""
    runner: web.AppRunner | None = None
    port: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not self.up:
            self.calls_down += 1
            return web.Response(status=503)
        self.successes[str(body["key"])] += 1
        self.times.append(time.monotonic())
        return web.Response(status=200)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{self.port}/"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def outage(bootstrap: str, args: argparse.Namespace, logdir: Path, *, breaker: bool) -> dict[str, Any]:
    down = Downstream()
    url = await down.start()
    name, topic = f"brk-{tag()}", f"brk-in-{tag()}"
    await apply(bootstrap, [TopicSpec(topic, args.partitions)])
    port = free_port()
    status_url = f"http://127.0.0.1:{port}"
    env = {"BENCH_TOPIC": topic, "BENCH_NAME": name, "BENCH_URL": url,
           "BENCH_BREAKER": "1" if breaker else "0", "STREAMSCHED_STATUS_PORT": str(port),
           "STREAMSCHED_STORE_DIR": str(logdir / f"stores-{name}")}
    worker = WorkerProcess("bench.breaker_app:app", bootstrap, env=env,
                           log_path=logdir / f"{name}.log").start()
    try:
        await wait_for(lambda: _ready(status_url), timeout=120, what="the worker to be ready")
        log(f"{'breaker' if breaker else 'baseline'}: worker ready; outage of {args.outage_s:.0f} s, "
            f"{args.items} items arriving")
        start = time.monotonic()
        async with Producer(bootstrap, linger_ms=5) as producer:
            sent = 0
            while sent < args.items:
                # A steady arrival rate over the outage.
                due = int(args.items * min(1.0, (time.monotonic() - start) / args.outage_s)) + 1
                batch = [make_event("due", "acme", [f"item-{i}"]) for i in range(sent, min(due, args.items))]
                if batch:
                    await produce_events(producer, topic, batch)
                    sent += len(batch)
                await asyncio.sleep(0.1)
        await asyncio.sleep(max(0.0, args.outage_s - (time.monotonic() - start)))
        down.up = True
        recovered = time.monotonic()
        calls_down = down.calls_down
        log(f"downstream up: {calls_down} calls during the outage; waiting for the drain")
        await wait_drained(bootstrap, f"streamsched.{name}", topic, timeout=args.timeout_s)
        deadline = time.monotonic() + 60
        while len(down.successes) < args.items and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        recovery_s = time.monotonic() - recovered
        status = await fetch_status(status_url)
    finally:
        worker.terminate(60)
        await down.stop()
    dead = await read_topic(bootstrap, internal_topic("dlq", name), timeout_s=60)
    opened = sum(v for s in status.get("schedulers", []) for k, v in s.get("counters", {}).items()
                 if k.startswith("breaker_opened"))
    return {"dead_letters": len(dead), "calls": calls_down, "succeeded": len(down.successes),
            "max_successes": max(down.successes.values(), default=0), "recovery_s": round(recovery_s, 1),
            "opened": opened}


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"items": args.items, "outage_s": args.outage_s, "partitions": args.partitions}
    if args.baseline:
        base = await outage(bootstrap, args, logdir, breaker=False)
        result |= {"baseline_dead_letters": base["dead_letters"], "baseline_calls": base["calls"]}
    got = await outage(bootstrap, args, logdir, breaker=True)
    result |= {
        "outage_dead_letters": got["dead_letters"],
        "outage_calls": got["calls"],
        "outage_calls_ratio": round(got["calls"] / args.items, 5),
        "succeeded": got["succeeded"],
        "max_successes_per_item": got["max_successes"],
        "executed_once": got["succeeded"] == args.items and got["max_successes"] == 1,
        "recovery_s": got["recovery_s"],
        "breaker_opened": got["opened"],
    }
    return result


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--broker-pid", type=int, default=None)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--outage-s", type=float, default=300.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--baseline", action="store_true", help="also run the outage without a breaker first")
    args = ap.parse_args()
    result = run_on_broker(main, args, prefix="bench-breaker-")
    print(json.dumps(result))


if __name__ == "__main__":
    cli()
