"""The handler's door to effects (streamsched/worker/app.py ``Commands``): exactly the
scheduler's declared commands, each Kafka-native one writing only its declared outputs."""

from __future__ import annotations

import pytest

from streamsched import App, CommandContext, Emit, Selection, Turn, external_command, kafka_command
from streamsched.errors import CommandNotAllowed
from streamsched.worker.app import Commands, SchedulerDef

CTX = CommandContext(idempotency_key="sched_x", fence=3, attempt=1, ordinal=1, scheduled_ns=0, scheduler="s")


@kafka_command(outputs=["out"])
def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
    return [Emit("out", f"{order}@{ctx.fence}".encode())]


@kafka_command(outputs=["out"])
async def ship_later(ctx: CommandContext, *, order: str) -> list[Emit]:
    return [Emit("out", order.encode())]


@kafka_command(outputs=["out"])
def stray(ctx: CommandContext) -> list[Emit]:
    return [Emit("elsewhere", b"x")]


@external_command()
async def charge(ctx: CommandContext, *, amount: int) -> dict[str, int]:
    return {"amount": amount, "fence": ctx.fence}


def scheduler() -> SchedulerDef:
    app = App("t")

    @app.scheduler(name="s", topic="t", selection=Selection("due"),
                   commands=[ship, ship_later, stray, charge])
    async def handle(turn: Turn) -> None:
        return None

    return app.schedulers["s"]


def commands(s: SchedulerDef) -> Commands:
    return s.commands_type(s.name, s.commands, CTX)


async def test_declared_commands_are_methods_and_record_what_they_did() -> None:
    s = scheduler()
    c = commands(s)
    assert {"ship", "ship_later", "stray", "charge"} <= set(type(c).__dict__)  # no __getattr__ per call
    assert s.commands_type is s.commands_type  # built once per scheduler
    assert await c.ship(order="o1") is None
    await c.ship_later(order="o2")
    assert await c.charge(amount=5) == {"amount": 5, "fence": 3}
    assert c.emitted == (Emit("out", b"o1@3"), Emit("out", b"o2"))
    assert c.results == ({"amount": 5, "fence": 3},)


async def test_an_undeclared_command_or_output_is_refused() -> None:
    c = commands(scheduler())
    with pytest.raises(CommandNotAllowed, match="'refund'"):
        c.refund  # noqa: B018 - the attribute lookup itself refuses
    with pytest.raises(CommandNotAllowed, match="stray -> elsewhere"):
        await c.stray()
    assert c.emitted == ()


async def test_the_base_class_still_serves_any_declared_command() -> None:
    s = scheduler()
    c = Commands(s.name, s.commands, CTX)
    await c.ship(order="o3")
    assert c.emitted == (Emit("out", b"o3@3"),)
