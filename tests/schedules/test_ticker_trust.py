"""What the ticker trusts, on a real broker: forged feedback (4a) and corrupt records (4h).

Feedback rows may be produced by anyone who can write to the catalog's feedback topic; only
rows for occurrences the ticker really fired may advance a schedule. Undecodable definition and
state records are counted and logged (never their bytes), and a corrupt schedule state never
resets its schedule: a one-time job whose only state is corrupt is held, not fired again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from streamsched.kafka import clients
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.schedule import HistoryRow, ScheduleStatus
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker, TickerConfig
from streamsched.testing import running, wait_for
from streamsched.wire.schedule import HISTORY_CODEC
from streamsched.wire.transition import decode_transition

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]
S = 10**9
T0 = 1_800_000_000 * S
SECRET = b"corrupt-secret-9d2e"


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def ticking(catalog: Catalog, clock: Clock) -> AbstractAsyncContextManager[Ticker]:
    return running(Ticker(catalog, TickerConfig(bootstrap=catalog.bootstrap, clock=clock,
                                                session_timeout_ms=6000)))


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("trust"), partitions=2)
    await cat.ensure_topics()
    return cat


async def produce(catalog: Catalog, topic: str, key: str, value: bytes,
                  headers: list[tuple[str, bytes]] | None = None) -> None:
    producer = clients.producer(catalog.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode(), headers=headers,
                                     partition=partition_for_key(key.encode(), catalog.partitions))
    finally:
        await producer.stop()


async def forge(catalog: Catalog, name: str, occurrence: str, planned_ns: int, state: str) -> None:
    row = HistoryRow(f"{name}.v1", occurrence, planned_ns, 1, state, T0)  # type: ignore[arg-type]
    await produce(catalog, catalog.feedback_topic, name, HISTORY_CODEC.encode(row.to_record()))


def counter(ticker: Ticker, key: str) -> float:
    return float(ticker.metrics.snapshot()["counters"].get(key, 0))


async def status(catalog: Catalog, name: str) -> ScheduleStatus | None:
    st = (await catalog.states()).get(name)
    return st.status if st is not None else None


async def test_forged_feedback_cannot_complete_or_fail_a_one_time_job(
        catalog: Catalog, make_topic: Callable[..., object], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamsched")
    target = await make_topic("occ")  # type: ignore[misc]
    clock = Clock(T0)
    at = T0 + 5 * S
    await catalog.schedule("later", f"@at {_rfc3339(T0 + 3600 * S)}", target)
    await catalog.schedule("fired", f"@at {_rfc3339(at)}", target)
    await catalog.schedule("every", "@every 10s", target)
    async with ticking(catalog, clock) as ticker:
        await wait_for(lambda: _has_states(catalog, 3), timeout=30, what="states")
        clock.now = T0 + 10 * S  # "fired" and "every" fire; no target worker reports anything
        await wait_for(lambda: _last_fired(catalog, {"fired": at, "every": T0 + 10 * S}), timeout=30,
                       what="fires")
        later_at = T0 + 3600 * S
        forged = [
            ("later", f"later.v1/{later_at}", later_at, "SUCCEEDED"),  # not fired yet
            ("fired", f"fired.v1/{at + 1}", at + 1, "FAILED"),  # not its instant
            ("fired", f"fired.v1/{at}", at, "RUNNING"),  # not a result
            ("fired", f"other.v1/{at}", at, "FAILED"),  # names another schedule's occurrence
            ("every", f"every.v1/{T0 + 20 * S}", T0 + 20 * S, "SUCCEEDED"),  # in the future
            ("every", f"every.v1/{T0 + 5 * S}", T0 + 5 * S, "FAILED"),  # not a boundary
        ]
        for name, occ, planned, state in forged:
            await forge(catalog, name, occ, planned, state)

        async def all_rejected() -> bool:
            return counter(ticker, "feedback_rejected") >= len(forged)

        await wait_for(all_rejected, timeout=30, what="forged rows to be rejected")
        assert counter(ticker, "feedback_rejected") == len(forged)
        assert await status(catalog, "later") is ScheduleStatus.ACTIVE
        assert await status(catalog, "fired") is ScheduleStatus.ACTIVE
        # The real report of the fired occurrence (what its target worker writes) is accepted.
        await forge(catalog, "fired", f"fired.v1/{at}", at, "SUCCEEDED")
        await wait_for(lambda: _is(catalog, "fired", ScheduleStatus.COMPLETED), timeout=30,
                       what="the genuine result to complete the job")
    assert [r.state for r in await catalog.history("later")] == []
    assert [r.state for r in await catalog.history("fired")] == ["RUNNING", "SUCCEEDED"]
    assert "rejected" in caplog.text and "feedback" in caplog.text


async def test_corrupt_records_are_counted_and_never_reset_a_schedule(
        catalog: Catalog, make_topic: Callable[..., object], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamsched")
    target = await make_topic("occ")  # type: ignore[misc]
    clock = Clock(T0)
    await catalog.schedule("steady", "@every 10s", target)
    await catalog.schedule("once", f"@at {_rfc3339(T0 + 5 * S)}", target)
    async with ticking(catalog, clock):
        await wait_for(lambda: _has_states(catalog, 2), timeout=30, what="states")
        clock.now = T0 + 20 * S
        await wait_for(lambda: _fired(catalog, {"steady": 2, "once": 1}), timeout=30, what="fires")
    # A schedule whose only state record is corrupt (as if compaction had removed the good
    # ones before it): the ticker wrote it for version 1, then its bytes rotted.
    await catalog.schedule("orphan", f"@at {_rfc3339(T0 + 15 * S)}", target)
    garbage = b"\x00\xff" + SECRET
    await produce(catalog, catalog.state_topic, "orphan", garbage, headers=[("ss-version", b"1")])
    # A corrupt state after a good one, and an undecodable definition.
    await produce(catalog, catalog.state_topic, "steady", garbage)
    await produce(catalog, catalog.definitions_topic, "junk", garbage)

    async with ticking(catalog, clock) as ticker:
        async def counted() -> bool:
            c = ticker.metrics.snapshot()["counters"]
            return (c.get("undecodable_records{kind=state}", 0) >= 2
                    and c.get("undecodable_records{kind=definition}", 0) >= 1 and ticker.ready)

        await wait_for(counted, timeout=30, what="corrupt records to be counted")
        gauges = ticker.metrics.snapshot()["gauges"]
        assert sum(v for k, v in gauges.items() if k.startswith("schedules_held")) == 1
        clock.now = T0 + 30 * S
        await wait_for(lambda: _fired(catalog, {"steady": 3}), timeout=30, what="steady to go on")
    fired = [decode_transition(r.value).event_id for r in await read_topic(catalog.bootstrap, target)]
    # "steady" went on from its last good state (no reset: 10, 20, then 30); "orphan" was held
    # (a fresh state would have fired its passed instant); "once" fired once.
    assert sorted(e for e in fired if e.startswith("steady.")) == [
        f"steady.v1/{T0 + k * S}" for k in (10, 20, 30)]
    assert [e for e in fired if e.startswith("orphan.")] == []
    assert [e for e in fired if e.startswith("once.")] == [f"once.v1/{T0 + 5 * S}"]
    states = await catalog.states()
    assert states["steady"].fired == 3 and "orphan" not in states
    assert "held" in caplog.text and "undecodable" in caplog.text
    assert SECRET.decode() not in caplog.text

    # An operator writes a new version: the held schedule resets (a new identity) and fires.
    assert await catalog.disable("orphan") and await catalog.enable("orphan")
    async with ticking(catalog, clock):
        await wait_for(lambda: _fired(catalog, {"orphan": 1}), timeout=30, what="the reset schedule")
    fired = [decode_transition(r.value).event_id for r in await read_topic(catalog.bootstrap, target)]
    assert [e for e in fired if e.startswith("orphan.")] == [f"orphan.v3/{T0 + 15 * S}"]


def _rfc3339(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _has_states(catalog: Catalog, n: int) -> bool:
    return len(await catalog.states()) >= n


async def _fired(catalog: Catalog, expected: dict[str, int]) -> bool:
    states = await catalog.states()
    return all(states.get(k) is not None and states[k].fired >= v for k, v in expected.items())


async def _last_fired(catalog: Catalog, expected: dict[str, int]) -> bool:
    states = await catalog.states()
    return all(states.get(k) is not None and states[k].last_fired_ns == v for k, v in expected.items())


async def _is(catalog: Catalog, name: str, st: ScheduleStatus) -> bool:
    return await status(catalog, name) is st


async def test_feedback_offsets_are_committed_past_the_reporters_markers(
        catalog: Catalog, make_topic: Callable[..., object]) -> None:
    """Target workers report in their transactions, so a COMMIT marker follows each report.
    The ticker commits its consumer's position (past the marker), not the last row + 1: the
    feedback group's lag returns to 0 instead of staying at 1 per reporting partition."""
    from streamsched.kafka.reads import group_lag

    target = await make_topic("occ")  # type: ignore[misc]
    await catalog.schedule("every", "@every 10s", target)
    async with ticking(catalog, Clock(T0)):
        await wait_for(lambda: _has_states(catalog, 1), timeout=30, what="states")
        producer = clients.transactional_producer(catalog.bootstrap, f"reporter-{catalog.name}")
        await producer.start()
        try:
            row = HistoryRow("every.v1", f"every.v1/{T0}", T0, 1, "SUCCEEDED", T0)  # type: ignore[arg-type]
            async with producer.transaction():
                await producer.send(catalog.feedback_topic, HISTORY_CODEC.encode(row.to_record()),
                                    key=b"every", partition=partition_for_key(b"every", catalog.partitions))
        finally:
            await producer.stop()

        async def no_lag() -> bool:
            lag = await group_lag(catalog.bootstrap, catalog.group, catalog.feedback_topic)
            return sum(lag.end.values()) == 2 and lag.total == 0  # the row and its marker

        await wait_for(no_lag, timeout=30, what="the feedback group to commit past the marker")
