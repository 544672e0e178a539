"""Fairness per tenant: a cap on the in-flight slots one tenant holds in a partition.

With ``tenant_slots=1`` a tenant's backlog holds one slot of the window; its other records wait
on the delay topic (spaced by how long an item takes), so another tenant's records behind the
backlog run at once instead of after it. Identities are unchanged, so each still runs exactly
once. The real-broker counterpart is the last test of tests/worker/test_flow_kafka.py.
"""

from __future__ import annotations

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError
from streamsched.testing import TestApp


def build(order: list[str], *, slots: int | None) -> App:
    app = App("fair")

    @external_command()
    async def charge(ctx: CommandContext, *, ref: str) -> None:
        order.append(ref)

    @app.scheduler(name="charges", topic="invoices", selection=Selection("due", type="due"),
                   commands=[charge], max_in_flight=4, tenant_slots=slots)
    async def handle(turn: Turn) -> None:
        await turn.commands.charge(ref=f"{turn.event.tenant}:{turn.event.target[0]}")

    return app


async def run(slots: int | None) -> tuple[list[str], dict[str, int]]:
    order: list[str] = []
    async with TestApp(build(order, slots=slots)) as t:
        events = [t.event(type="due", tenant="big", target=[f"b{i}"]) for i in range(12)]
        events += [t.event(type="due", tenant="small", target=[f"s{i}"]) for i in range(2)]
        await t.emit(*events)
        await t.advance(seconds=30)
        return order, dict(t.metrics().counters)


async def test_a_tenants_backlog_no_longer_runs_ahead_of_another_tenant() -> None:
    order, counters = await run(1)
    assert sorted(order) == sorted([f"big:b{i}" for i in range(12)] + ["small:s0", "small:s1"])
    assert len(order) == len(set(order))  # each exactly once
    # The small tenant's records came behind twelve of the big one's; they ran right after the
    # first of them, not after all.
    assert order.index("small:s0") <= 2 and order.index("small:s1") <= 3, order
    assert counters["tenant_deferred"] >= 11


async def test_without_a_cap_the_backlog_runs_first() -> None:
    order, counters = await run(None)
    assert order.index("small:s0") >= 12, order
    assert "tenant_deferred" not in counters


def test_a_cap_outside_the_window_or_on_a_kafka_native_scheduler_is_refused() -> None:
    for bad in (0, -1, 9, 1.5, True):
        with pytest.raises(ConfigError, match="tenant_slots"):
            build([], slots=bad)  # type: ignore[arg-type]
