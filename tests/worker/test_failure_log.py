"""Every failed attempt and every dead letter logs one WARNING line (streamsched/worker/failurelog.py):
scheduler, partition, identity digest, attempt, error kind and type; never the payload, the
plaintext identity or the exception's message; rate-limited per (scheduler, line, kind).
Broker-free: the worker's own turn on the in-memory Kafka (TestApp)."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

import pytest

from streamsched import App, CommandContext, RetryPolicy, Selection, Turn, external_command
from streamsched.logs import RateLimiter, TextFormatter
from streamsched.model.retry import Retryable
from streamsched.testing import TestApp
from streamsched.worker import failurelog

SECRET = "card-4242-SECRET"

app = App("billing")


@external_command()
async def charge(ctx: CommandContext, *, invoice: str) -> str:
    return invoice


# The README quickstart's scheduler: given an event without a target, its handler raises IndexError.
@app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge])
async def charge_due(turn: Turn) -> None:
    await turn.commands.charge(invoice=turn.event.target[0])


flaky = App("flaky")


@flaky.scheduler(topic="flaky", selection=Selection("due", type="due"), commands=[],
                 retry=RetryPolicy(initial_interval_s=1.0, maximum_interval_s=1.0, maximum_attempts=2,
                                   jitter=0))
async def always_down(turn: Turn) -> None:
    raise Retryable(f"destination down for {SECRET}")


Lines = Callable[[], list[str]]


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lines]:
    """The lines the worker logged so far at the default level (WARNING), formatted as
    ``streamsched run`` formats them (with their context), through a fresh rate limiter."""
    monkeypatch.setattr(failurelog, "LIMITER", RateLimiter(lines=failurelog.LINES, interval_s=60))
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("streamsched")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield lambda: out.getvalue().splitlines()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


async def test_an_unexpected_handler_exception_logs_the_attempt_and_the_dead_letter(lines: Lines) -> None:
    async with TestApp(app) as t:
        [ev] = await t.emit(type="due", tenant=f"tenant-{SECRET}", payload={"card": SECRET})
        identity = t.identity(ev)
        assert len(t.dead_letters()) == 1
    attempt = [x for x in lines() if "attempt 1 failed" in x]
    dead = [x for x in lines() if "dead-lettered a record" in x]
    assert len(attempt) == 1 and len(dead) == 1, lines()
    assert (" WARNING streamsched.worker.failurelog attempt 1 failed: internal (IndexError); dead-lettered"
            in attempt[0])
    assert "dead-lettered a record of invoices: terminal (internal), attempt 1" in dead[0]
    for line in (attempt[0], dead[0]):
        assert "scheduler=charge_due" in line and "partition=" in line and f"identity={identity}" in line
    text = "\n".join(lines())
    # No payload, no plaintext identity, no exception message ("list index out of range").
    assert SECRET not in text and "out of range" not in text and "Traceback" not in text


async def test_a_retryable_failure_logs_each_attempt_and_what_follows(lines: Lines) -> None:
    async with TestApp(flaky) as t:
        await t.emit(type="due", tenant="acme", target=[SECRET])
        await t.advance(seconds=5)
        assert len(t.dead_letters()) == 1
    failed = [x.split("failurelog ")[1].split(" scheduler=")[0] for x in lines() if "failed:" in x]
    assert failed == ["attempt 1 failed: handler_retryable (Retryable); retry parked for 1.00 s",
                      "attempt 2 failed: handler_retryable (Retryable); dead-lettered after 2 attempts"]
    # The second attempt came back through the delay topic: its record there is dead-lettered.
    assert sum("dead-lettered a record of __streamsched.delay.always_down: terminal (handler_retryable), "
               "attempt 2" in x
               for x in lines()) == 1
    assert SECRET not in "\n".join(lines())


async def test_an_undecodable_record_logs_its_dead_letter_without_an_identity(lines: Lines) -> None:
    async with TestApp(app) as t:
        await t.produce("invoices", b"\x00" + SECRET.encode(), key=b"k")
        assert len(t.dead_letters()) == 1
    [line] = [x for x in lines() if "dead-lettered" in x]
    assert "dead-lettered a record of invoices: decode, attempt 1" in line
    assert "identity=" not in line and "offset=0" in line and SECRET not in line


async def test_a_flood_of_failures_is_rate_limited_per_scheduler_and_kind(
        monkeypatch: pytest.MonkeyPatch, lines: Lines) -> None:
    now = [0.0]
    monkeypatch.setattr(failurelog, "LIMITER", RateLimiter(lines=2, interval_s=60, clock=lambda: now[0]))
    async with TestApp(app) as t:
        for i in range(5):
            await t.emit(type="due", tenant=f"t{i}")
        now[0] = 61.0
        await t.emit(type="due", tenant="late")
        assert len(t.dead_letters()) == 6
    attempts = [x for x in lines() if "failed: internal" in x]
    assert len(attempts) == 3  # two, then suppressed, then one in the next interval...
    said = [x for x in lines() if "more charge_due/failed attempt/internal line(s) suppressed" in x]
    assert len(said) == 1 and " 3 more " in said[0]  # ...after saying how many it left out
    assert len([x for x in lines() if "dead-lettered a record" in x]) == 3


def test_the_limiter_counts_per_key_within_an_interval_and_says_the_rest_later() -> None:
    now = [100.0]
    limiter = RateLimiter(lines=2, interval_s=10, clock=lambda: now[0])
    assert [limiter.admit("a") for _ in range(4)] == [0, 0, None, None]
    assert limiter.admit("b") == 0  # another key has its own count
    now[0] += 9.9
    assert limiter.admit("a") is None
    now[0] += 0.1
    assert limiter.admit("a") == 3  # a new interval: logged, after the 3 it suppressed
    assert limiter.admit("a") == 0 and limiter.admit("a") is None


def test_the_limiter_remembers_a_bounded_number_of_keys() -> None:
    limiter = RateLimiter(lines=1, interval_s=10, max_keys=3, clock=lambda: 0.0)
    for key in range(100):
        assert limiter.admit(key) == 0
        assert len(limiter) <= 3
    assert limiter.admit(99) is None and limiter.admit(0) == 0  # 0 was forgotten first


def test_a_disabled_level_costs_no_count(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimiter(lines=1, interval_s=10, clock=lambda: 0.0)
    logger = logging.getLogger("streamsched.test.limiter")
    caplog.set_level(logging.ERROR, logger=logger.name)
    assert not limiter.log(logger, logging.WARNING, ("s", "x"), "quiet")
    caplog.set_level(logging.WARNING, logger=logger.name)
    assert limiter.log(logger, logging.WARNING, ("s", "x"), "first")
    assert not limiter.log(logger, logging.WARNING, ("s", "x"), "second")
    assert [r.getMessage() for r in caplog.records] == ["first"]


def test_rejects_a_limiter_that_could_never_log() -> None:
    with pytest.raises(ValueError, match="lines >= 1"):
        RateLimiter(lines=0)
