"""The scheduler bench/rolling.py runs in its worker processes (``streamsched run --app
bench.rolling_app:app``).

One external command that returns at once, so the figures are the restarts' cost, not the
work's. Each call appends ``<run id> <event produced_ns> <call time_ns>`` to ``BENCH_CALLS`` (one
file per worker process, line-buffered so a line is in the file once the call returns): the
bench counts calls per identity from these files (the audit) and takes each item's latency from
the producer's timestamp carried in the event to the call (one clock, one machine).
``BENCH_TOPIC`` and ``BENCH_NAME`` name the transition topic and the scheduler.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import IO

from streamsched import App, CommandContext, Selection, Turn, external_command

_CALLS: IO[str] | None = None


def _record(run_id: str, produced_ns: int) -> None:
    global _CALLS
    if _CALLS is None:
        _CALLS = open(os.environ["BENCH_CALLS"], "a", buffering=1)  # noqa: SIM115 - closed at exit
        atexit.register(_CALLS.close)
    _CALLS.write(f"{run_id} {produced_ns} {time.time_ns()}\n")


def build(topic: str, name: str) -> App:
    app = App("rolling")

    @external_command()
    async def complete_run(ctx: CommandContext, *, run_id: str, produced_ns: int) -> None:
        _record(run_id, produced_ns)

    async def handle(turn: Turn) -> None:
        await turn.commands.complete_run(run_id=turn.event.target[0], produced_ns=turn.event.produced_ns)

    app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[complete_run],
                  claim_duration_s=30)(handle)
    return app


app = build(os.environ.get("BENCH_TOPIC", "bench"), os.environ.get("BENCH_NAME", "bench"))
