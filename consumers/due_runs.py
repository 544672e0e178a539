"""Reference scheduler "due runs": select due runs, claim, complete (external), release.

Role: selection ``runs.transitions`` where ``type == "due"``; command ``complete_run`` only.
The external command writes to a SQLite ledger (``STREAMSCHED_LEDGER``) passing the stable
idempotency key and the fencing token, exactly what any external destination should receive.

Run it: ``streamsched run --app consumers.due_runs:app``
"""

from __future__ import annotations

import asyncio
import os
from functools import cache

from consumers.ledger import Ledger
from streamsched import App, CommandContext, Selection, Turn, external_command

NAMESPACE = os.environ.get("STREAMSCHED_NAMESPACE", "")
"""Suffix for topic and scheduler names so several instances can share one cluster."""
TOPIC = "runs.transitions" + NAMESPACE
app = App("due_runs")
LATENCY_S = float(os.environ.get("STREAMSCHED_LEDGER_LATENCY_S", "0"))
NAME = "due_runs" + NAMESPACE


@cache
def ledger() -> Ledger:
    return Ledger(os.environ.get("STREAMSCHED_LEDGER", ".streamsched/ledger.sqlite3"))


@external_command()
async def complete_run(ctx: CommandContext, *, run_id: str) -> bool:
    """Complete one run in the ledger, idempotent on ``ctx.idempotency_key``, fenced by ``ctx.fence``."""
    if LATENCY_S:
        await asyncio.sleep(LATENCY_S)  # an external system's latency (the zombie test pauses here)
    return await asyncio.to_thread(ledger().complete, ctx.idempotency_key, ctx.fence, run_id)


@app.scheduler(
    name=NAME,
    topic=TOPIC,
    selection=Selection("due", type="due"),
    commands=[complete_run],
    attempt_kind="complete_run",
    claim_duration_s=float(os.environ.get("STREAMSCHED_CLAIM_DURATION_S", "30")),
)
async def due_runs(turn: Turn) -> None:
    await turn.commands.complete_run(run_id=turn.event.target[0] if turn.event.target else "")
