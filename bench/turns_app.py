"""The scheduler bench/turns.py runs in a worker process (``streamsched run --app bench.turns_app:app``).

Two shapes, chosen by ``BENCH_KIND``:

* ``native``: the shape of consumers/pipelines.py, a Kafka-native command that emits one JSON
  event per item to ``BENCH_OUT`` (events, outcome, release and offset commit atomically);
* ``external``: the shape of consumers/due_runs.py, an external command (claim before effect)
  that does nothing, so the figure is streamsched's own cost, not a destination's.

``BENCH_TOPIC`` and ``BENCH_NAME`` name the transition topic and the scheduler (a fresh name
per run gives a fresh group and state topic over the same input).
"""

from __future__ import annotations

import atexit
import os
import time
from typing import IO

from streamsched import App, CommandContext, Emit, Selection, Turn, external_command, kafka_command
from streamsched.worker.app import Command, SchedulerDef

_TRACE: IO[str] | None = None
"""``BENCH_TRACE``: a file the handlers append ``<identity> <time_ns>`` to when they run (the
latency runs of bench/turns.py split an item's latency into stages with it)."""


_TRACE_PATH = os.environ.get("BENCH_TRACE")


def _traced(identity: str) -> None:
    global _TRACE
    if not _TRACE_PATH:
        return
    if _TRACE is None:
        _TRACE = open(_TRACE_PATH, "a", buffering=1 << 16)  # noqa: SIM115 - closed at exit
        atexit.register(_TRACE.close)
    _TRACE.write(f"{identity} {time.time_ns()}\n")


def build(kind: str, topic: str, name: str, out: str) -> App:
    """An app with one scheduler ``name`` of shape ``kind`` over ``topic``."""
    app = App("bench")
    commands: list[Command]
    if kind == "native":
        @kafka_command(outputs=[out])
        def start_pipeline(ctx: CommandContext, *, pipeline: str) -> list[Emit]:
            return [Emit.json(out, {"event": "pipeline.started", "pipeline": pipeline,
                                    "idempotency_key": ctx.idempotency_key, "fence": ctx.fence},
                              key=ctx.idempotency_key.encode())]

        async def handle_native(turn: Turn) -> None:
            _traced(turn.ctx.idempotency_key)
            await turn.commands.start_pipeline(pipeline=turn.event.target[0])

        commands, handler = [start_pipeline], handle_native
    elif kind == "external":
        @external_command()
        async def complete_run(ctx: CommandContext, *, run_id: str) -> None:
            return None

        async def handle_external(turn: Turn) -> None:
            _traced(turn.ctx.idempotency_key)
            await turn.commands.complete_run(run_id=turn.event.target[0])

        commands, handler = [complete_run], handle_external
    else:
        raise ValueError(f"unknown bench kind {kind!r}")
    app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=commands,
                  claim_duration_s=30)(handler)
    return app


def scheduler(kind: str, topic: str, name: str, out: str) -> SchedulerDef:
    return build(kind, topic, name, out).schedulers[name]


app = build(os.environ.get("BENCH_KIND", "external"), os.environ.get("BENCH_TOPIC", "bench"),
            os.environ.get("BENCH_NAME", "bench"), os.environ.get("BENCH_OUT", "bench-out"))
