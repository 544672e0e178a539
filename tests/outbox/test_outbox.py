"""The outbox on both backends (SQLite and a real PostgreSQL): enqueue in the service's
transaction, leases, retries with backoff, the attempts bound. Deliveries go to a recording
function here; tests/outbox/test_outbox_kafka.py delivers to a real broker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from outbox_support import Backend, enqueue, prepare, service_tx

from streamsched.errors import BoundExceeded, ConfigError, DecodeError, InvalidName
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.retry import Retryable, RetryPolicy, Terminal
from streamsched.outbox import Intent, Outbox
from streamsched.testing import make_event, wait_for
from streamsched.wire.transition import decode_transition

FAST = RetryPolicy(initial_interval_s=0.3, backoff_coefficient=2.0, maximum_interval_s=5.0,
                   maximum_attempts=3, jitter=0.0)


class Recorder:
    """A deliver function that records each call and fails as told."""

    def __init__(self, fail: list[BaseException] | None = None, delay: float = 0.0) -> None:
        self.calls: list[tuple[Intent, float]] = []
        self.fail = list(fail or [])
        self.delay = delay
        self.active: set[int] = set()
        self.overlaps = 0

    async def __call__(self, intent: Intent) -> None:
        if intent.id in self.active:
            self.overlaps += 1
        self.active.add(intent.id)
        try:
            self.calls.append((intent, time.monotonic()))
            await asyncio.sleep(self.delay)
            if self.fail:
                raise self.fail.pop(0)
        finally:
            self.active.discard(intent.id)


async def test_enqueue_then_run_once_delivers_each_intent(backend: Backend, table: str) -> None:
    events = [make_event("due", "acme", [f"inv-{i}"], due_ns=i, payload={"n": i}) for i in range(3)]
    async with prepare(backend, table) as outbox:
        enqueue(backend, outbox, events)
        assert (await outbox.counts()).pending == 3
        deliver = Recorder()
        assert [await outbox.run_once("relay-a", deliver) for _ in range(4)] == [True, True, True, False]
        got = [i for i, _ in deliver.calls]
        assert [decode_transition(i.value) for i in got] == events  # enqueue order, bytes intact
        assert [i.idempotency_key for i in got] == [e.event_id for e in events]
        assert [i.key for i in got] == [route_key(e.tenant, e.target) for e in events]
        assert {(i.topic, i.attempt, i.lease_owner) for i in got} == {("orders", 1, "relay-a")}
        counts = await outbox.counts()
        assert (counts.pending, counts.leased, counts.dead) == (0, 0, 0)  # delivered = deleted
        assert outbox.metrics.counters["outbox_delivered"] == 3


async def test_rolled_back_service_transaction_leaves_no_intent(backend: Backend, table: str) -> None:
    async with prepare(backend, table) as outbox:
        with pytest.raises(RuntimeError, match="business rule"), service_tx(backend) as conn:
            outbox.enqueue(conn, "orders", make_event("due", "acme", ["inv-1"]))
            raise RuntimeError("business rule failed after the enqueue")
        committed = make_event("due", "acme", ["inv-2"])
        enqueue(backend, outbox, [committed])
        deliver = Recorder()
        assert await outbox.run_once("r", deliver)
        assert not await outbox.run_once("r", deliver)
        assert [i.event_id for i, _ in deliver.calls] == [committed.event_id]


async def test_invalid_events_raise_typed_errors_and_insert_nothing(backend: Backend, table: str) -> None:
    good = make_event("due", "acme", ["inv-1"])
    bad: list[tuple[str, Any, type[Exception]]] = [
        ("orders", TransitionEvent("", "due", "t", ("x",), 0, b"{}", 0), DecodeError),     # empty event_id
        ("orders", TransitionEvent("e", "due", "t", ("x",), 0, b"{not json", 0), DecodeError),
        ("orders", TransitionEvent("e", "due", "t", ("x",), -1, b"{}", 0), DecodeError),   # due_ns < 0
        ("orders", TransitionEvent("e", "due", "t" * 300, ("x",), 0, b"{}", 0), BoundExceeded),
        ("orders", "not an event", DecodeError),
        ("bad topic!", good, InvalidName),
        ("__streamsched.x", good, InvalidName),
    ]
    async with prepare(backend, table) as outbox:
        with service_tx(backend) as conn:
            for topic, ev, err in bad:
                with pytest.raises(err):
                    outbox.enqueue(conn, topic, ev)
        counts = await outbox.counts()
        assert (counts.pending, counts.leased, counts.dead) == (0, 0, 0)


async def test_two_relays_never_deliver_one_intent_at_once(backend: Backend, table: str) -> None:
    events = [make_event("due", "acme", [f"inv-{i}"]) for i in range(40)]
    a = prepare(backend, table, batch_size=4, lease_s=30)
    b = Outbox(backend.dsn, table=table, batch_size=4, lease_s=30)
    enqueue(backend, a, events)
    deliver = Recorder(delay=0.01)  # one recorder shared by both relays sees every overlap
    stop = asyncio.Event()
    async with a, b:
        tasks = [asyncio.create_task(a.relay("relay-a", stop, deliver)),
                 asyncio.create_task(b.relay("relay-b", stop, deliver))]

        async def drained() -> bool:
            c = await a.counts()
            return c.pending + c.leased == 0

        try:
            await wait_for(drained, timeout=60, what="both relays to drain the outbox")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert deliver.overlaps == 0
    ids = sorted(i.event_id for i, _ in deliver.calls)
    assert ids == sorted(e.event_id for e in events)  # each delivered once: nobody waited out a lease
    assert {i.lease_owner for i, _ in deliver.calls} == {"relay-a", "relay-b"}


async def test_an_unexpired_lease_is_honoured_and_an_expired_one_reclaimed(backend: Backend,
                                                                           table: str) -> None:
    ev = make_event("due", "acme", ["inv-1"])
    crashed = prepare(backend, table, lease_s=1)
    enqueue(backend, crashed, [ev])
    async with crashed, Outbox(backend.dsn, table=table, lease_s=1) as other:
        [held] = await crashed.claim("relay-dead")  # claimed, then the relay "dies": never reports
        assert (held.attempt, held.lease_owner) == (1, "relay-dead")
        deliver = Recorder()
        assert not await other.run_once("relay-b", deliver)  # the lease is honoured
        assert (await other.counts()).leased == 1

        async def reclaimed() -> bool:
            return await other.run_once("relay-b", deliver)

        await wait_for(reclaimed, timeout=10, interval=0.1, what="the expired lease to be reclaimed")
        [(again, _)] = deliver.calls
        assert (again.id, again.idempotency_key, again.attempt, again.lease_owner) == (
            held.id, ev.event_id, 2, "relay-b")
        # The late relay's report cannot touch an intent it no longer holds.
        assert await crashed.fail(held, ConnectionError("late")) == "lost"
        assert (await other.counts()).pending == 0


async def test_failed_delivery_is_retried_after_backoff_with_the_same_key(backend: Backend,
                                                                           table: str) -> None:
    ev = make_event("due", "acme", ["inv-1"])
    async with prepare(backend, table, policy=FAST) as outbox:
        enqueue(backend, outbox, [ev])
        deliver = Recorder(fail=[Retryable("try later"), ConnectionError("broker away")])
        failed_at: list[float] = []
        for _ in range(3):
            async def attempted() -> bool:
                return await outbox.run_once("relay", deliver)

            await wait_for(attempted, timeout=10, interval=0.02, what="the next attempt to fall due")
            failed_at.append(time.monotonic())
            if len(failed_at) < 3:
                assert not await outbox.run_once("relay", deliver)  # not due again yet
        starts = [t for _, t in deliver.calls]
        assert [i.attempt for i, _ in deliver.calls] == [1, 2, 3]
        assert {i.idempotency_key for i, _ in deliver.calls} == {ev.event_id}
        # Backoff of FAST (no jitter): 0.3 s after the first failure, 0.6 s after the second.
        assert starts[1] - failed_at[0] >= 0.3 - 0.05
        assert starts[2] - failed_at[1] >= 0.6 - 0.05
        assert outbox.metrics.counters["outbox_retries{kind=handler_retryable}"] == 1
        assert outbox.metrics.counters["outbox_retries{kind=transport}"] == 1
        counts = await outbox.counts()
        assert (counts.pending, counts.leased, counts.dead) == (0, 0, 0)


async def test_attempts_bound_marks_intents_dead_by_kind(backend: Backend, table: str) -> None:
    policy = RetryPolicy(initial_interval_s=0.05, maximum_interval_s=0.05, maximum_attempts=2, jitter=0.0)
    flaky, poison = make_event("due", "acme", ["flaky"]), make_event("due", "acme", ["poison"])
    async with prepare(backend, table, policy=policy) as outbox:
        enqueue(backend, outbox, [flaky])
        enqueue(backend, outbox, [poison])
        deliver = Recorder(fail=[ConnectionError("1"), Terminal("never"), ConnectionError("2")])

        async def settled() -> bool:
            await outbox.run_once("relay", deliver)
            c = await outbox.counts()
            return c.pending + c.leased == 0

        await wait_for(settled, timeout=10, interval=0.02, what="both intents to die")
        counts = await outbox.counts()
        assert counts.dead == 2 and counts.dead_by_kind == {"transport": 1, "handler_terminal": 1}
        keys = [i.event_id for i, _ in deliver.calls]
        assert keys.count(flaky.event_id) == 2 and keys.count(poison.event_id) == 1  # terminal: no retry
        assert not await outbox.run_once("relay", deliver)  # dead intents are never claimed

        # Requeued, they get a fresh set of attempts and are delivered.
        assert await outbox.requeue_dead("transport") == 1
        assert await outbox.run_once("relay", deliver)
        counts = await outbox.counts()
        assert (counts.pending, counts.dead, counts.dead_by_kind) == (0, 1, {"handler_terminal": 1})


async def test_a_last_attempt_that_never_reports_is_buried_as_lease_expired(backend: Backend,
                                                                              table: str) -> None:
    policy = RetryPolicy(maximum_attempts=1)
    async with prepare(backend, table, policy=policy, lease_s=1) as outbox:
        enqueue(backend, outbox, [make_event("due", "acme", ["inv-1"])])
        assert len(await outbox.claim("relay-dead")) == 1
        deliver = Recorder()

        async def buried() -> bool:
            return await outbox.run_once("relay-b", deliver)

        await wait_for(buried, timeout=10, interval=0.1, what="the expired last attempt to be buried")
        assert deliver.calls == []
        assert (await outbox.counts()).dead_by_kind == {"lease_expired": 1}


class DeadlineSpy:
    """``asyncio`` as streamsched.outbox.core sees it, recording each ``wait_for`` timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def wait_for(self, aw: Any, timeout: float) -> Any:
        self.timeouts.append(timeout)
        return await asyncio.wait_for(aw, timeout)


async def test_a_delivery_past_its_lease_is_cancelled_and_retried(
        backend: Backend, table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.outbox import core

    spy = DeadlineSpy()
    monkeypatch.setattr(core, "asyncio", spy)
    async with prepare(backend, table, policy=FAST, lease_s=1) as outbox:
        enqueue(backend, outbox, [make_event("due", "acme", ["slow"])])
        deliver = Recorder(delay=30)
        t0 = time.monotonic()
        assert await outbox.run_once("relay", deliver)
        # Cancelled inside its lease, not after: the delivery's deadline, counted from before the
        # claim, ends before the 1 s lease does (whatever the machine's speed), ...
        [timeout] = spy.timeouts
        assert 0 < timeout <= 0.9
        # ... and it was cancelled there, not left to its 30 s (only a long stall breaks this).
        assert time.monotonic() - t0 < 15
        assert deliver.active == set()
        assert outbox.metrics.counters["outbox_retries{kind=timeout}"] == 1
        deliver.delay = 0

        async def delivered() -> bool:
            return await outbox.run_once("relay", deliver)

        await wait_for(delivered, timeout=10, interval=0.05, what="the retry")
        assert [i.attempt for i, _ in deliver.calls] == [1, 2]


def test_configuration_is_validated(tmp_path: Any) -> None:
    with pytest.raises(ConfigError):
        Outbox("mysql://x", table="t")
    with pytest.raises(ConfigError):
        Outbox("sqlite:///x.db", table="t; DROP TABLE users")
    with pytest.raises(BoundExceeded):
        Outbox("sqlite:///x.db", lease_s=0.1)
    with pytest.raises(BoundExceeded):
        Outbox("sqlite:///x.db", batch_size=65)
    with pytest.raises(ConfigError):
        Outbox("sqlite:///x.db").enqueue(object(), "orders", make_event("due", "t", ["x"]))


async def test_run_once_refuses_a_bad_worker_id(tmp_path: Any) -> None:
    async with Outbox(f"sqlite:///{tmp_path / 'o.db'}") as outbox:
        await outbox.ensure_schema()
        with pytest.raises(ConfigError):
            await outbox.run_once("", Recorder())


async def test_relay_outlives_database_errors(backend: Backend, table: str) -> None:
    outbox = Outbox(backend.dsn, table=table, idle_max_s=0.1)
    deliver = Recorder()
    stop = asyncio.Event()
    async with outbox:
        task = asyncio.create_task(outbox.relay("relay", stop, deliver))
        try:
            async def failing() -> bool:  # the table does not exist yet: every round fails
                return sum(v for k, v in outbox.metrics.counters.items()
                           if k.startswith("outbox_relay_errors")) >= 2

            await wait_for(failing, timeout=10, interval=0.05, what="failed relay rounds")
            assert not task.done()
            enqueue(backend, prepare(backend, table), [make_event("due", "acme", ["inv-1"])])

            async def delivered() -> bool:
                return len(deliver.calls) == 1

            await wait_for(delivered, timeout=10, interval=0.05, what="delivery once the table exists")
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
