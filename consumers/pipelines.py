"""Reference scheduler "pipeline transitions": claim, start (Kafka-native), release.

Role: selection ``pipelines.transitions`` where ``type == "queued"``; command
``start_pipeline`` only, which may write to ``pipelines.events`` and nowhere else. The emitted
``pipeline.started`` event, the outcome and the release commit in one Kafka transaction, so the
effect happens exactly once inside Kafka (read it with isolation_level=read_committed).

Run it: ``streamsched run --app consumers.pipelines:app``
"""

from __future__ import annotations

import os

from streamsched import App, CommandContext, Emit, Selection, Turn, kafka_command

NAMESPACE = os.environ.get("STREAMSCHED_NAMESPACE", "")
"""Suffix for topic and scheduler names so several instances can share one cluster."""
TOPIC = "pipelines.transitions" + NAMESPACE
EVENTS = "pipelines.events" + NAMESPACE
app = App("pipelines")
NAME = "pipelines" + NAMESPACE


@kafka_command(outputs=[EVENTS])
def start_pipeline(ctx: CommandContext, *, pipeline: str) -> list[Emit]:
    return [Emit.json(EVENTS, {"event": "pipeline.started", "pipeline": pipeline,
                               "idempotency_key": ctx.idempotency_key, "fence": ctx.fence},
                      key=ctx.idempotency_key.encode())]


@app.scheduler(
    name=NAME,
    topic=TOPIC,
    selection=Selection("queued", type="queued"),
    commands=[start_pipeline],
    attempt_kind="start_pipeline",
    claim_duration_s=float(os.environ.get("STREAMSCHED_CLAIM_DURATION_S", "30")),
)
async def pipelines(turn: Turn) -> None:
    await turn.commands.start_pipeline(pipeline=turn.event.target[0] if turn.event.target else "")
