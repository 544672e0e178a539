"""A Java producer (kafka-clients + Apache Avro, from Maven) written from docs/wire-contract.md
reproduces the test vectors, lands on the home partitions with the Java client's default
partitioner, and a streamsched scheduler executes its events once per identity."""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.reads import read_topic
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import business_identity
from streamsched.testing import running_worker, wait_drained
from streamsched.worker.app import SchedulerDef

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VECTORS = ROOT / "docs" / "wire-vectors.json"
PARTITIONS = 8

pytestmark = pytest.mark.skipif(not (shutil.which("mvn") and shutil.which("java")),
                                reason="needs Maven and a JDK (java, mvn) on PATH")


def classpath(out: Path) -> str:
    """kafka-clients + avro, resolved by Maven (cached in ~/.m2 after the first run)."""
    target = out / "cp.txt"
    subprocess.run(["mvn", "-q", "-B", "-f", str(HERE / "pom.xml"), "dependency:build-classpath",
                    f"-Dmdep.outputFile={target}"], check=True, timeout=110, stdin=subprocess.DEVNULL)
    return target.read_text().strip()


def run_java(cp: str, bootstrap: str, topic: str, names: list[str]) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        ["java", "-cp", cp, str(HERE / "WireProducer.java"), bootstrap, topic, str(PARTITIONS),
         str(VECTORS), str(ROOT / "schemas" / "transition.avsc"), *names],
        capture_output=True, text=True, timeout=110, stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, lines


def recording_scheduler(topic: str, name: str, calls: list[CommandContext]) -> SchedulerDef:
    app = App("java-wire")

    @external_command()
    async def record(ctx: CommandContext) -> str:
        calls.append(ctx)
        return ctx.idempotency_key

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[record],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        await turn.commands.record()

    return app.schedulers[name]


async def test_java_producer_events_execute_once(bootstrap: str, make_topic, unique,
                                                 tmp_path: Path) -> None:
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))["valid"]
    now = time.time_ns()
    # Events the scheduler below selects and can run now (not parked until a far due time).
    chosen = [v for v in vectors if v["event"]["type"] == "due" and v["event"]["origin"] is None
              and v["event"]["due_ns"] <= now]
    assert len(chosen) >= 6
    names = [v["name"] for v in chosen] * 2  # every record twice: duplicates must not run again
    topic = await make_topic("java", partitions=PARTITIONS)
    started = time.monotonic()
    cp = await asyncio.to_thread(classpath, tmp_path)
    code, lines = await asyncio.to_thread(run_java, cp, bootstrap, topic, names)
    assert time.monotonic() - started < 120
    summary = lines[-1]
    assert code == 0 and summary["mismatches"] == [], summary
    assert summary["checked"] == len(vectors) and summary["produced"] == len(names)
    home = {v["name"]: v["partitions"][str(PARTITIONS)] for v in vectors}
    assert [(line["name"], line["partition"]) for line in lines[:-1]] == [(n, home[n]) for n in names]

    calls: list[CommandContext] = []
    sched = recording_scheduler(topic, unique("s").replace("-", "_"), calls)
    async with running_worker(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
    expected = set()
    for v in chosen:
        e = v["event"]
        ev = TransitionEvent(e["event_id"], e["type"], e["tenant"], tuple(e["target"]), e["due_ns"],
                             e["payload"].encode(), e["produced_ns"], attempt=e["attempt"])
        expected.add(business_identity(sched.identity_parts(ev)))
    per_identity = collections.Counter(c.idempotency_key for c in calls)
    assert set(per_identity) == expected and set(per_identity.values()) == {1}
    assert not worker.metrics.counters.get("forwarded")
    assert await read_topic(bootstrap, sched.dead_letter_topic) == []
