"""A Faust agent emits transitions; a streamsched scheduler executes each identity once.

Real broker, real processes: examples/faust_emitter.py as a Faust worker (its agent sends through
:class:`streamsched.integrations.faust.TransitionSender`) and ``consumers.due_runs`` as a
``streamsched run`` worker writing the SQLite ledger. Every job is produced twice, so the agent
emits every transition twice; the ledger must still show one call per identity.

The Faust app runs with a CRC32 ``producer_partitioner`` (librdkafka's default family, not
Kafka's murmur2): every transition must still land on murmur2(route key), the partition the
scheduler owns it on. Under ``exactly_once`` this is the case the sender works around (Faust's
transaction manager drops an explicit partition for topics the app does not consume).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from components import require_module

from consumers.harness import Workflow, create_topics
from consumers.ledger import Ledger
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.model.identity import route_key
from streamsched.testing import ROOT, WorkerProcess, child_pythonpath, wait_drained, wait_for
from streamsched.testing.kit import FAST_FAILOVER_ENV
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition

require_module("faust", "faust-streaming is not installed (pip install 'streamsched[faust]')")

PARTITIONS = 4
JOBS = 12


def _jobs(namespace: str) -> list[dict[str, object]]:
    return [{"tenant": f"tenant-{i % 3}", "run_id": f"run-{i}{namespace}",
             "due_ns": 1_700_000_000 * 10**9 + i}
            for i in range(JOBS)]


def _start_faust(bootstrap: str, namespace: str, guarantee: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, STREAMSCHED_BOOTSTRAP=bootstrap, STREAMSCHED_NAMESPACE=namespace,
               FAUST_DATADIR=str(tmp_path / "faust-data"), FAUST_PROCESSING_GUARANTEE=guarantee,
               EMITTER_PARTITIONER="crc32",
               PYTHONPATH=child_pythonpath([ROOT], os.environ.get("PYTHONPATH")))
    log = open(tmp_path / "faust.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen([sys.executable, str(ROOT / "examples" / "faust_emitter.py"), "worker",
                                 "--without-web", "-l", "info"], cwd=str(tmp_path), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_faust_agent_emits_transitions_a_scheduler_executes_once(bootstrap: str, tmp_path: Path,
                                                                       guarantee: str) -> None:
    ns = f".ff-{uuid.uuid4().hex[:8]}"
    wf = Workflow("due_runs", ns, tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=PARTITIONS)
    await apply(bootstrap, [TopicSpec("jobs" + ns, 2, kind="output")])
    jobs = _jobs(ns)
    keys = [route_key(str(j["tenant"]), (str(j["run_id"]),)) for j in jobs]
    # The CRC32 partitioner would misroute some of these identities: the test can see a failure.
    assert any(partition_for_key(k, PARTITIONS) != zlib.crc32(k) % PARTITIONS for k in keys)

    faust_worker = _start_faust(bootstrap, ns, guarantee, tmp_path)
    scheduler = WorkerProcess(wf.app_ref, bootstrap, env={**FAST_FAILOVER_ENV, **wf.env},
                              log_path=tmp_path / "scheduler.log", cwd=ROOT).start()
    try:
        producer = clients.producer(bootstrap, linger_ms=5)
        await producer.start()
        try:
            for _ in range(2):  # every job twice: the agent emits every transition twice
                await asyncio.gather(*[await producer.send("jobs" + ns, json.dumps(j).encode(),
                                                           key=str(j["run_id"]).encode()) for j in jobs])
        finally:
            await producer.stop()

        records: list[Any] = []

        async def emitted() -> bool:
            assert faust_worker.poll() is None, (tmp_path / "faust.log").read_text()[-3000:]
            records[:] = await read_topic(bootstrap, wf.topic)
            return len(records) >= 2 * JOBS

        await wait_for(emitted, timeout=60, what="the Faust agent to emit every transition")
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=60)
    finally:
        scheduler.terminate()
        faust_worker.terminate()
        try:
            faust_worker.wait(30)
        except subprocess.TimeoutExpired:
            faust_worker.kill()
            faust_worker.wait(10)

    # Every record: keyed by its route key, on murmur2's partition (not the app's CRC32 one).
    assert len(records) == 2 * JOBS
    for rec in records:
        ev = decode_transition(rec.value)
        key = route_key(ev.tenant, ev.target)
        assert rec.key == key
        assert rec.partition == partition_for_key(key, PARTITIONS), ev.target
        assert ev.type == "due" and ev.event_id == f"job-{ev.target[0]}"
    assert sorted(rec.key for rec in records) == sorted(keys * 2)

    # Exactly one execution per identity, although each transition arrived twice.
    identities = {wf.identity(decode_transition(rec.value)) for rec in records}
    ledger = Ledger(wf.ledger)
    assert len(identities) == JOBS
    assert {key for key, _, _ in ledger.effects()} == identities
    assert len(ledger.calls()) == JOBS, "an identity was executed more than once"
