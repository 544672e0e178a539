"""A Faust app whose agent turns job messages into streamsched ``due`` transitions.

The agent reads JSON jobs (``{"tenant": "acme", "run_id": "r-1", "due_ns": 0}``) from ``jobs``
and emits one transition per job to ``runs.transitions``, the topic of the reference scheduler
``consumers.due_runs``, through :class:`streamsched.integrations.faust.TransitionSender`: the
record is validated like :class:`streamsched.Producer` would, keyed by its route key and sent to
its murmur2 home partition, whatever Faust's own partitioner says. A job delivered twice (Faust is
at-least-once by default) emits its transition twice; the scheduler still completes the run once,
because the transition's business identity (tenant, target, due time) is the same.

Run it beside the scheduler (``pip install 'streamsched[faust]'``)::

    streamsched run --app consumers.due_runs:app           # the scheduler (completes runs once)
    python examples/faust_emitter.py worker --without-web -l info   # this Faust worker (no web server)
    # then produce jobs, e.g. with kcat or any producer:
    echo '{"tenant":"acme","run_id":"r-1"}' | kcat -P -b 127.0.0.1:9092 -t jobs

Environment: ``STREAMSCHED_BOOTSTRAP`` (``host:port[,host:port]``, default ``127.0.0.1:9092``);
``STREAMSCHED_NAMESPACE`` (suffix of every topic and of the app id, as in consumers/);
``FAUST_DATADIR`` (Faust's local state directory, default ``.faust-emitter``);
``FAUST_PROCESSING_GUARANTEE`` (``at_least_once``, the default, or ``exactly_once``);
``EMITTER_PARTITIONER=crc32`` installs a librdkafka-style CRC32 partitioner as the app's
``producer_partitioner``, to show it cannot move a transition (the tests use it).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import faust

from streamsched.integrations.faust import CODEC_NAME, TransitionSender, register_codec

NAMESPACE = os.environ.get("STREAMSCHED_NAMESPACE", "")
JOBS = "jobs" + NAMESPACE
TRANSITIONS = "runs.transitions" + NAMESPACE  # consumers.due_runs' topic
BROKER = ";".join(f"kafka://{hp.strip()}" for hp in
                  os.environ.get("STREAMSCHED_BOOTSTRAP", "127.0.0.1:9092").split(",") if hp.strip())


def crc32_partitioner(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """librdkafka's ``consistent`` partitioner (CRC32): NOT Kafka's murmur2, on purpose."""
    return all_partitions[zlib.crc32(key or b"") % len(all_partitions)]


register_codec()  # "streamsched": lets other topics of the app read/write transitions by name

app = faust.App(
    "faust-emitter" + NAMESPACE,
    broker=BROKER,
    datadir=os.environ.get("FAUST_DATADIR", ".faust-emitter"),
    processing_guarantee=os.environ.get("FAUST_PROCESSING_GUARANTEE", "at_least_once"),
    producer_partitioner=crc32_partitioner if os.environ.get("EMITTER_PARTITIONER") == "crc32" else None,
    web_enabled=False,
)
jobs = app.topic(JOBS, value_serializer="json")
runs = TransitionSender(app.topic(TRANSITIONS, value_serializer=CODEC_NAME))


@app.agent(jobs)
async def emit_due_runs(stream: AsyncIterator[Any]) -> None:
    async for job in stream:
        # The sender validates before anything is sent: a malformed job raises DecodeError here
        # (Faust logs it and moves on) instead of becoming a record the scheduler dead-letters.
        await runs.send({
            "type": "due",
            "tenant": job["tenant"],
            "target": [job["run_id"]],
            "due_ns": int(job.get("due_ns", 0)),
            "event_id": f"job-{job['run_id']}",
            "payload": {"source": "faust-emitter"},
        })


if __name__ == "__main__":
    app.main()
