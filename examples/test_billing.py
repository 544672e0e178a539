"""Unit tests of examples/billing.py with TestApp: no broker, no sleeps, a virtual clock.

``python -m pytest examples/test_billing.py``. Each test is a plain function running its scenario
with ``asyncio.run``, so no asyncio plugin is needed (with pytest-asyncio, write ``async def``
tests and drop the wrapper).
"""

from __future__ import annotations

import asyncio
import json

from examples.billing import app, psp
from streamsched.model.claims import OutcomeKind
from streamsched.testing import TestApp

DAY_NS = 86_400 * 10**9


def setup_function() -> None:
    psp.charges.clear()
    psp.busy_for = 0


def test_a_due_invoice_is_charged_once_however_often_its_event_comes() -> None:
    async def scenario() -> None:
        async with TestApp(app) as t:
            for _ in range(3):  # at-least-once delivery: the same event three times
                await t.emit(type="due", tenant="acme", target=["inv-1"], payload={"amount": 1250})
            assert list(psp.charges.values()) == [("inv-1", 1250)]
            outcome = t.outcome(type="due", tenant="acme", target=["inv-1"])
            assert outcome is not None and outcome.kind is OutcomeKind.SUCCEEDED

    asyncio.run(scenario())


def test_a_busy_payment_service_is_retried_after_its_backoff() -> None:
    async def scenario() -> None:
        async with TestApp(app) as t:
            psp.busy_for = 2
            await t.emit(type="due", tenant="acme", target=["inv-1"], payload={"amount": 1250})
            assert psp.charges == {}  # attempt 1 failed; the retry waits in the delay topic
            await t.advance(seconds=29)
            assert psp.charges == {}
            await t.advance(seconds=1)  # attempt 2 at +30 s fails, attempt 3 is due 60 s later
            assert psp.charges == {}
            await t.advance(seconds=60)
            assert list(psp.charges.values()) == [("inv-1", 1250)]
            assert t.metrics("charge_due").counters["retries_parked"] == 2

    asyncio.run(scenario())


def test_an_invoice_no_retry_can_fix_is_dead_lettered() -> None:
    async def scenario() -> None:
        async with TestApp(app) as t:
            await t.emit(type="due", tenant="acme", target=["inv-0"], payload={"amount": 0})
            [dead] = t.dead_letters()
            # A safe reason: the kind of failure, never the exception's text or the payload.
            assert (dead.kind, dead.reason) == ("terminal", "handler_terminal")
            assert psp.charges == {}

    asyncio.run(scenario())


def test_an_invoice_due_tomorrow_is_charged_tomorrow() -> None:
    async def scenario() -> None:
        async with TestApp(app) as t:
            tomorrow = t.now_ns + DAY_NS
            await t.emit(type="due", tenant="acme", target=["inv-2"], payload={"amount": 99},
                         due_ns=tomorrow)
            await t.advance(hours=23)
            assert psp.charges == {}
            await t.advance(hours=1)
            assert list(psp.charges.values()) == [("inv-2", 99)]

    asyncio.run(scenario())


def test_an_overdue_invoice_gets_one_reminder() -> None:
    async def scenario() -> None:
        async with TestApp(app) as t:
            await t.emit(type="overdue", tenant="acme", target=["inv-3"])
            await t.emit(type="overdue", tenant="acme", target=["inv-3"])
            reminders = [json.loads(r.value or b"") for r in t.emitted("reminders")]
            assert [r["invoice"] for r in reminders] == ["inv-3"]

    asyncio.run(scenario())
