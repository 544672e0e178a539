"""A small billing app, as a user writes it; ``examples/test_billing.py`` unit-tests it with TestApp.

``charge_due`` charges an invoice once its ``due`` event comes (retrying a busy payment service
with backoff, dead-lettering an invoice no retry can fix); ``remind_overdue`` turns an
``overdue`` event into a reminder on the ``reminders`` topic (Kafka-native: the reminder commits
with the outcome). Run it for real with ``streamsched run --app examples.billing:app``.
"""

from __future__ import annotations

from streamsched import (
    App,
    CommandContext,
    Emit,
    Retryable,
    RetryPolicy,
    Selection,
    Terminal,
    Turn,
    external_command,
    kafka_command,
)


class PaymentService:
    """Stands in for a payment provider's client: idempotent on the key, as a real one must be."""

    def __init__(self) -> None:
        self.charges: dict[str, tuple[str, int]] = {}
        self.busy_for = 0
        """How many more calls answer "busy" (tests set it)."""

    async def charge(self, invoice: str, amount: int, *, idempotency_key: str, fence: int) -> str:
        if self.busy_for > 0:
            self.busy_for -= 1
            raise Retryable("payment service busy")
        if amount <= 0:
            raise Terminal(f"invoice {invoice} has amount {amount}")
        self.charges.setdefault(idempotency_key, (invoice, amount))
        return idempotency_key


psp = PaymentService()
app = App("billing")


@external_command()
async def charge(ctx: CommandContext, *, invoice: str, amount: int) -> str:
    return await psp.charge(invoice, amount, idempotency_key=ctx.idempotency_key, fence=ctx.fence)


@kafka_command(outputs=["reminders"])
def remind(ctx: CommandContext, *, invoice: str) -> list[Emit]:
    return [Emit.json("reminders", {"invoice": invoice, "reminder": ctx.idempotency_key},
                      key=invoice.encode())]


@app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge],
               retry=RetryPolicy(initial_interval_s=30, backoff_coefficient=2, maximum_interval_s=600,
                                 maximum_attempts=5, jitter=0))
async def charge_due(turn: Turn) -> None:
    body = turn.event.json()
    assert isinstance(body, dict)
    await turn.commands.charge(invoice=turn.event.target[0], amount=int(body["amount"]))


@app.scheduler(topic="invoices", selection=Selection("overdue", type="overdue"), commands=[remind])
async def remind_overdue(turn: Turn) -> None:
    await turn.commands.remind(invoice=turn.event.target[0])
