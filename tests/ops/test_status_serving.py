"""`streamsched run --status-port` and `streamsched schedule tick --status-port` serve /metrics, /status,
/healthz and /readyz from the real processes, with their metrics moving as work flows (real broker)."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
from prom_text import parse_prometheus

from consumers.harness import Workflow, build_events, create_topics, produce
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import free_port
from streamsched.ops.status import fetch_status
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker
from streamsched.testing import WorkerProcess, wait_for
from streamsched.worker.intake import Worker

ENV = {"STREAMSCHED_SESSION_TIMEOUT": "6s", "STREAMSCHED_HEARTBEAT": "1s"}


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s, s.get(url) as resp:
        return resp.status, await resp.text()


async def answers(url: str) -> bool:
    try:
        return (await get(url + "/healthz"))[0] == 200
    except aiohttp.ClientError:
        return False


async def check_probes(url: str, service: type) -> None:
    """/healthz is 200; /readyz follows the service's `ready` (503 until the service has one)."""
    assert await get(url + "/healthz") == (200, "ok\n")
    if isinstance(getattr(service, "ready", None), property):
        async def ready() -> bool:
            return (await get(url + "/readyz"))[0] == 200

        await wait_for(ready, timeout=60, what="/readyz to answer 200")
        assert (await fetch_status(url))["ready"] is True
    else:
        assert await get(url + "/readyz") == (503, "not ready\n")


async def test_worker_process_serves_status(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".st-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=2)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**wf.env, **ENV, "STREAMSCHED_STATUS_PORT": str(port), "STREAMSCHED_STATUS_HOST": "127.0.0.1"}
    worker = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "w.log").start()
    try:
        await wait_for(lambda: answers(url), timeout=60, what="the status server")
        await check_probes(url, Worker)
        await produce(bootstrap, wf, build_events(wf, unique=10, duplicates=0))

        async def committed() -> bool:
            doc = await fetch_status(url)
            return doc["schedulers"][0]["counters"].get("committed", 0) >= 10

        await wait_for(committed, timeout=90, what="10 records committed, as /status shows")
        doc = await fetch_status(url)
        assert [s["scheduler"] for s in doc["schedulers"]] == [wf.name]
        snap = doc["schedulers"][0]
        assert snap["counters"]["executions"] == 10 and snap["histograms"]["turn_seconds"]["count"] >= 1
        status, text = await get(url + "/metrics")
        families = parse_prometheus(text)
        assert status == 200
        assert families["streamsched_executions_total"]["samples"][0][1] == {"scheduler": wf.name}
        assert families["streamsched_turn_seconds"]["type"] == "histogram"
        assert {s[1]["partition"] for s in families["streamsched_committed_offset"]["samples"]} <= {"0", "1"}
    finally:
        assert worker.terminate(timeout=60) == 0
    assert not await answers(url)  # the server went with the process


async def test_ticker_process_serves_status(bootstrap: str, tmp_path: Path) -> None:
    catalog = Catalog(bootstrap, f"st-{uuid.uuid4().hex[:8]}", partitions=2)
    await catalog.ensure_topics()
    target = f"occ-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(target, 1)])
    await catalog.schedule("every-second", "@every 1s", target)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ticker = WorkerProcess("", bootstrap, env=ENV, log_path=tmp_path / "t.log", command=[
        "schedule", "tick", "--catalog", catalog.name, "--partitions", "2",
        "--status-port", str(port), "--status-host", "127.0.0.1"]).start()
    try:
        await wait_for(lambda: answers(url), timeout=60, what="the ticker's status server")
        await check_probes(url, Ticker)

        async def fired() -> bool:
            doc = await fetch_status(url)
            return doc["schedulers"][0]["counters"].get("occurrences_fired", 0) >= 2

        await wait_for(fired, timeout=60, what="occurrences fired, as /status shows")
        doc = await fetch_status(url)
        assert [s["scheduler"] for s in doc["schedulers"]] == [f"ticker.{catalog.name}"]
        families = parse_prometheus((await get(url + "/metrics"))[1])
        assert families["streamsched_occurrences_fired_total"]["type"] == "counter"
    finally:
        assert ticker.terminate(timeout=60) == 0
