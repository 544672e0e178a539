"""The worker turn on a real broker, in process: selection, dead letters, restarts, least authority."""

from __future__ import annotations

import pytest

from streamsched import App, CommandContext, Emit, Selection, Turn, external_command, kafka_command
from streamsched.kafka.reads import read_topic
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.testing import make_event, produce_events, running_worker, wait_drained
from streamsched.wire.avro import AvroCodec
from streamsched.wire.claim import CLAIM_CODEC
from streamsched.wire.transition import encode_transition
from streamsched.worker.app import SchedulerDef

pytestmark = pytest.mark.kafka
SECRET = "tenant-secret-4f1c"


running = running_worker


async def states(bootstrap: str, sched: SchedulerDef) -> dict[str, list[ClaimState]]:
    out: dict[str, list[ClaimState]] = {}
    for rec in await read_topic(bootstrap, sched.state_topic):
        if rec.value is None:
            continue  # a tombstone past the outcome horizon
        st = ClaimState.from_record(CLAIM_CODEC.decode(rec.value))
        out.setdefault(st.identity, []).append(st)
    return out


async def test_selection_duplicates_and_dead_letters(bootstrap: str, make_topic, recording_scheduler) -> None:
    topic = await make_topic("w", partitions=2)
    rec = recording_scheduler(topic)
    sched, calls = rec.sched, rec.calls
    good = [make_event("due", SECRET, [f"r{i}"], due_ns=i) for i in range(10)]
    dupes = [make_event("due", SECRET, [f"r{i}"], due_ns=i) for i in range(5)]
    noise = [make_event("other", SECRET, ["x"])]
    misrouted = make_event("due", SECRET, ["m"])
    garbage = [(b"k1", b"\x00not avro" + SECRET.encode()), (b"k2", None)]
    await produce_events(bootstrap, topic, good + dupes + noise,
                         raw=[*garbage, (b"wrong-key", encode_transition(misrouted))])
    await rec.drain(bootstrap, timeout=60)

    assert rec.per_identity() == dict.fromkeys(rec.identities(good), 1)
    assert all(c.fence >= 1 and c.ordinal >= 1 and c.scheduler == sched.name for c in calls)
    dead = await read_topic(bootstrap, sched.dead_letter_topic)
    kinds = sorted(dict(r.headers)["ss-kind"].decode() for r in dead)
    assert kinds == ["decode", "decode", "misrouted"]
    dl_codec = AvroCodec("dead_letter")
    for r in dead:
        headers = b"".join(k.encode() + v for k, v in r.headers)
        assert SECRET.encode() not in headers
        assert SECRET not in dl_codec.decode(r.value)["reason"]
        assert dict(r.headers)["ss-source-topic"].decode() == topic
    history = await states(bootstrap, sched)
    assert all(h[-1].status is ClaimStatus.RELEASED and h[-1].outcome is not None for h in history.values())


async def test_restart_skips_stored_outcomes_with_fresh_fences(bootstrap: str, make_topic,
                                                               recording_scheduler) -> None:
    topic = await make_topic("r", partitions=2)
    rec = recording_scheduler(topic)
    sched = rec.sched
    events = [make_event("due", "t", [f"r{i}"]) for i in range(6)]
    await produce_events(bootstrap, topic, events)
    await rec.drain(bootstrap, timeout=60)
    assert len(rec.calls) == 6
    # A replay of the same events reaches a fresh worker (new owner): no new effects.
    await produce_events(bootstrap, topic, [make_event(e.type, e.tenant, e.target) for e in events])
    second = await rec.drain(bootstrap, timeout=60)
    assert len(rec.calls) == 6
    assert second.metrics.counters.get("skipped_outcome") == 6
    for history in (await states(bootstrap, sched)).values():
        fences = [s.fence for s in history if s.status is ClaimStatus.CLAIMED]
        assert fences == [1, 2]  # strictly increasing across owners and restarts
        assert history[-1].outcome is not None and history[-1].outcome.fence == 1


async def test_handler_limited_to_declared_commands(bootstrap: str, make_topic, unique) -> None:
    topic = await make_topic("a")
    out = await make_topic("out", kind="output")
    other = await make_topic("other", kind="output")
    app = App("t")
    name = unique("s").replace("-", "_")

    @kafka_command(outputs=[out])
    def start(ctx: CommandContext, *, where: str) -> list[Emit]:
        return [Emit.json(where, {"k": ctx.idempotency_key})]

    @app.scheduler(name=name, topic=topic, selection=Selection("all"), commands=[start], claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        if turn.event.type == "undeclared":
            await turn.commands.delete_everything()
        await turn.commands.start(where=other if turn.event.type == "escape" else out)

    sched = app.schedulers[name]
    await produce_events(bootstrap, topic, [make_event("undeclared", "t", ["a"]),
                                            make_event("escape", "t", ["b"]),
                                            make_event("ok", "t", ["c"])])
    async with running(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
    assert len(await read_topic(bootstrap, out)) == 1
    assert await read_topic(bootstrap, other) == []
    dead = await read_topic(bootstrap, sched.dead_letter_topic)
    assert sorted(dict(r.headers)["ss-kind"].decode() for r in dead) == ["terminal", "terminal"]
    assert worker.metrics.counters.get("executions") == 1


async def test_a_worker_refuses_to_start_while_a_declared_output_topic_is_missing(
        bootstrap: str, make_topic, unique) -> None:
    from streamsched.errors import ConfigError
    from streamsched.worker.intake import Worker, WorkerConfig

    topic = await make_topic("a")
    out, missing = await make_topic("out", kind="output"), unique("never-made")
    app = App("t")
    name = unique("s").replace("-", "_")

    @kafka_command(outputs=[out, missing])
    def start(ctx: CommandContext) -> list[Emit]:
        return []

    @app.scheduler(name=name, topic=topic, selection=Selection("all"), commands=[start])
    async def handle(turn: Turn) -> None:
        await turn.commands.start()

    with pytest.raises(ConfigError, match=f"topic {missing} does not exist"):
        await Worker(app.schedulers[name], WorkerConfig(bootstrap=bootstrap)).ensure_topics()


async def test_logs_status_and_errors_never_carry_payloads(bootstrap: str, make_topic, unique,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from streamsched.model.jsonval import json_dumps

    caplog.set_level(logging.DEBUG, logger="streamsched")
    topic = await make_topic("red")
    app = App("t")
    name = unique("s").replace("-", "_")

    @external_command()
    async def leak(ctx: CommandContext, *, secret: str) -> None:
        raise RuntimeError(f"failed for {secret}")  # a careless handler puts data in its message

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[leak],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        await turn.commands.leak(secret=SECRET)

    sched = app.schedulers[name]
    await produce_events(bootstrap, topic, [make_event("due", SECRET, ["x"], payload={"k": SECRET})])
    async with running(sched, bootstrap) as worker:
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
    assert worker.metrics.last_error is not None and worker.metrics.last_error["type"] == "RuntimeError"
    assert SECRET not in json_dumps(worker.metrics.snapshot()).decode()
    assert SECRET not in caplog.text
    dead = await read_topic(bootstrap, sched.dead_letter_topic)
    assert [dict(r.headers)["ss-reason"] for r in dead] == [b"internal"]


async def test_a_delay_partition_holding_only_an_aborted_transaction_is_committed_past(
        bootstrap: str, make_topic, recording_scheduler) -> None:
    """A parking owner that fails before its commit leaves an aborted record and its ABORT
    marker in the delay partition, and nothing was ever committed there. A read_committed
    consumer receives nothing from it, so only the position shows the gap: the next owner must
    still commit past it (seen on CI after a paused broker: delay lag 2 forever)."""
    from aiokafka import TopicPartition

    from streamsched.kafka import clients
    from streamsched.kafka.admin import TopicSpec, apply
    from streamsched.kafka.reads import group_lag

    topic = await make_topic("ab")
    rec = recording_scheduler(topic)
    sched = rec.sched
    await apply(bootstrap, [TopicSpec(sched.delay_topic, 1, 1, kind="delay")])
    producer = clients.transactional_producer(bootstrap, f"aborted-{sched.name}")
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(sched.delay_topic, b"never-committed", key=b"k", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    consumer = clients.consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(sched.delay_topic, 0)
        assert (await consumer.end_offsets([tp]))[tp] == 2  # the record and its ABORT marker
    finally:
        await consumer.stop()
    await produce_events(bootstrap, topic, [make_event("due", "t", ["x"])])
    async with running(sched, bootstrap):
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
    assert (await group_lag(bootstrap, sched.group, sched.delay_topic)).committed == {0: 2}
    assert len(rec.calls) == 1
