"""A Java producer (kafka-clients + Apache Avro, from Maven) written from docs/wire-contract.md
reproduces the test vectors, lands on the home partitions with the Java client's default
partitioner, and a streamsched scheduler executes its events once per identity."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from java_support import maven_classpath, requires, run_java

from streamsched.kafka.reads import read_topic
from streamsched.model.event import TransitionEvent

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VECTORS = ROOT / "docs" / "wire-vectors.json"
PARTITIONS = 8

pytestmark = requires("java", "mvn")


def produce_vectors(cp: str, bootstrap: str, topic: str,
                    names: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """WireProducer checks every vector, then produces the ``names`` ones: its exit code and the
    JSON lines it printed (one per record, then a summary)."""
    proc = run_java(HERE / "WireProducer.java", cp, [bootstrap, topic, str(PARTITIONS), str(VECTORS),
                                                     str(ROOT / "schemas" / "transition.avsc"), *names])
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


async def test_java_producer_events_execute_once(bootstrap: str, make_topic, recording_scheduler,
                                                 tmp_path: Path) -> None:
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))["valid"]
    now = time.time_ns()
    # Events the scheduler below selects and can run now (not parked until a far due time).
    chosen = [v for v in vectors if v["event"]["type"] == "due" and v["event"]["origin"] is None
              and v["event"]["due_ns"] <= now]
    assert len(chosen) >= 6
    names = [v["name"] for v in chosen] * 2  # every record twice: duplicates must not run again
    topic = await make_topic("java", partitions=PARTITIONS)
    cp = await asyncio.to_thread(maven_classpath, HERE / "pom.xml", tmp_path)
    code, lines = await asyncio.to_thread(produce_vectors, cp, bootstrap, topic, names)
    summary = lines[-1]
    assert code == 0 and summary["mismatches"] == [], summary
    assert summary["checked"] == len(vectors) and summary["produced"] == len(names)
    home = {v["name"]: v["partitions"][str(PARTITIONS)] for v in vectors}
    assert [(line["name"], line["partition"]) for line in lines[:-1]] == [(n, home[n]) for n in names]

    rec = recording_scheduler(topic)
    worker = await rec.drain(bootstrap)
    events = [TransitionEvent(e["event_id"], e["type"], e["tenant"], tuple(e["target"]), e["due_ns"],
                              e["payload"].encode(), e["produced_ns"], attempt=e["attempt"])
              for e in (v["event"] for v in chosen)]
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)  # duplicates never ran again
    assert not worker.metrics.counters.get("forwarded")
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []
