"""Traces across a real broker (streamsched/tracing.py), with the OpenTelemetry SDK's in-memory
exporter: a service's send, the worker's execution and the event it emits, and the downstream
scheduler's execution are one trace; the outbox keeps the service's trace; spans carry no payload,
tenant or target; without an SDK nothing is written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamsched import App, CommandContext, Emit, Selection, Turn, external_command, kafka_command, tracing
from streamsched.kafka.producer import Producer
from streamsched.kafka.reads import read_topic
from streamsched.outbox import Outbox
from streamsched.testing import make_event, running_worker, wait_drained, wait_for
from tests.conftest import TopicFactory

pytestmark = [pytest.mark.kafka]

MARKER = "tenant-secret-7"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    try:
        yield spans
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def _trace_id(headers: object) -> str | None:
    for key, value in headers or ():  # type: ignore[attr-defined]
        if key == "traceparent":
            return bytes(value).decode().split("-")[1]
    return None


async def test_a_chain_service_scheduler_downstream_is_one_trace(
        bootstrap: str, make_topic: TopicFactory, exporter: InMemorySpanExporter) -> None:
    first, second = await make_topic("trace-a", partitions=2), await make_topic("trace-b", partitions=2)
    app = App("tracing")
    ran: list[str] = []

    @kafka_command(outputs=[second])
    def forward(ctx: CommandContext, *, order: str) -> list[Emit]:
        follow = make_event("shipped", MARKER, [order], payload={"secret": MARKER})
        return [Emit.transition(second, follow)]

    @external_command()
    async def record(ctx: CommandContext) -> None:
        ran.append(ctx.idempotency_key)

    ns = first.rsplit("-", 1)[-1]

    @app.scheduler(name=f"trace_up_{ns}", topic=first, selection=Selection("due", type="due"),
                   commands=[forward])
    async def up(turn: Turn) -> None:
        await turn.commands.forward(order=turn.event.target[0])

    @app.scheduler(name=f"trace_down_{ns}", topic=second, selection=Selection("shipped", type="shipped"),
                   commands=[record])
    async def down(turn: Turn) -> None:
        await turn.commands.record()

    provider_tracer = tracing._tracer()
    with provider_tracer.start_as_current_span("service request") as root:
        async with Producer(bootstrap) as producer:
            await producer.send(first, make_event("due", MARKER, ["o-1"], payload={"secret": MARKER}))
    root_trace = f"{root.get_span_context().trace_id:032x}"
    [sent] = await read_topic(bootstrap, first)
    assert _trace_id(sent.headers) == root_trace

    async with running_worker(app.schedulers[f"trace_up_{ns}"], bootstrap), \
            running_worker(app.schedulers[f"trace_down_{ns}"], bootstrap):
        async def done() -> bool:
            return len(ran) == 1

        await wait_for(done, timeout=90, what="the downstream scheduler to run")
        await wait_drained(bootstrap, f"streamsched.trace_down_{ns}", second, timeout=60)
    executes = [s for s in exporter.get_finished_spans() if s.name == "streamsched.execute"]
    assert len(executes) == 2
    assert {f"{s.context.trace_id:032x}" for s in executes} == {root_trace}  # one trace end to end
    upstream = next(s for s in executes if s.attributes["streamsched.scheduler"] == f"trace_up_{ns}")
    downstream = next(s for s in executes if s.attributes["streamsched.scheduler"] == f"trace_down_{ns}")
    assert upstream.parent is not None and upstream.parent.span_id == root.get_span_context().span_id
    assert downstream.parent is not None and downstream.parent.span_id == upstream.context.span_id
    assert upstream.attributes["streamsched.outcome"] == "SUCCEEDED"
    assert str(upstream.attributes["streamsched.identity"]).startswith("sched_")
    [emitted] = await read_topic(bootstrap, second)
    assert _trace_id(emitted.headers) == root_trace
    for s in executes:
        assert MARKER not in str(dict(s.attributes or {})) and MARKER not in s.name


async def test_the_outbox_relay_continues_the_service_trace(
        bootstrap: str, make_topic: TopicFactory, exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    topic = await make_topic("trace-outbox")
    outbox = Outbox(f"sqlite:///{tmp_path / 'outbox.db'}")
    conn = sqlite3.connect(tmp_path / "outbox.db")
    outbox.create_schema(conn)
    with tracing._tracer().start_as_current_span("checkout") as root, conn:
        outbox.enqueue(conn, topic, make_event("due", "t", ["o-2"]))
    from streamsched.outbox.deliver import KafkaDelivery

    async with KafkaDelivery(bootstrap) as deliver:
        assert await outbox.run_once("relay-1", deliver)
    [rec] = await read_topic(bootstrap, topic)
    assert _trace_id(rec.headers) == f"{root.get_span_context().trace_id:032x}"
    [relay] = [s for s in exporter.get_finished_spans() if s.name == "streamsched.outbox.relay"]
    assert relay.parent is not None and relay.parent.span_id == root.get_span_context().span_id


async def test_without_an_sdk_nothing_is_written(bootstrap: str, make_topic: TopicFactory) -> None:
    assert not tracing.enabled()
    topic = await make_topic("trace-none")
    async with Producer(bootstrap) as producer:
        await producer.send(topic, make_event("due", "t", ["o-3"]))
    [rec] = await read_topic(bootstrap, topic)
    assert _trace_id(rec.headers) is None and tracing.inject() == []


def test_an_sdk_set_up_later_is_noticed_within_the_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    monkeypatch.setattr(tracing, "_SDK_SEEN", False)
    monkeypatch.setattr(tracing, "_NOT_YET_UNTIL", 0.0)
    assert not tracing.enabled()  # no SDK: believed for RECHECK_S without asking again
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: TracerProvider())
    assert not tracing.enabled()
    monkeypatch.setattr(tracing, "_NOT_YET_UNTIL", 0.0)  # the recheck interval has passed
    assert tracing.enabled()
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: tracing.trace.ProxyTracerProvider())
    assert tracing.enabled()  # a global provider is set once: never asked again
