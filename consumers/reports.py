"""Reference scheduler "reports": the target of a durable schedule (see `make demo`).

Role: selection ``reports.transitions`` where ``type == "report"``; command ``publish_report``
only, which may write to ``reports.events``. Each occurrence of a schedule arrives as a transition
whose identity is ``<schedule-id>/<planned-ns>``; the attempt's result flows back to the
schedule's history.

Run it: ``streamsched run --app consumers.reports:app``
"""

from __future__ import annotations

import os

from streamsched import App, CommandContext, Emit, Selection, Turn, kafka_command

NAMESPACE = os.environ.get("STREAMSCHED_NAMESPACE", "")
TOPIC = "reports.transitions" + NAMESPACE
EVENTS = "reports.events" + NAMESPACE
app = App("reports")


@kafka_command(outputs=[EVENTS])
def publish_report(ctx: CommandContext, *, planned_ns: int) -> list[Emit]:
    return [Emit.json(EVENTS, {"event": "report.published", "schedule": ctx.schedule,
                               "planned_ns": planned_ns, "idempotency_key": ctx.idempotency_key},
                      key=ctx.idempotency_key.encode())]


@app.scheduler(name="reports" + NAMESPACE, topic=TOPIC, selection=Selection("report", type="report"),
               commands=[publish_report], attempt_kind="publish_report",
               claim_duration_s=float(os.environ.get("STREAMSCHED_CLAIM_DURATION_S", "30")))
async def reports(turn: Turn) -> None:
    await turn.commands.publish_report(planned_ns=turn.event.due_ns)
