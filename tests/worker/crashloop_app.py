"""A scheduler whose handler SIGKILLs its own worker: a crash-looping item (issue 7, 4b).

Configured by environment (set by test_turn_defects_kafka.py): ``CRASHLOOP_TOPIC``,
``CRASHLOOP_NAME`` (scheduler name) and ``CRASHLOOP_LOG``, a file that gets one line per
delivery (the claim ordinal), written and synced before the process kills itself.
"""

from __future__ import annotations

import os
import signal

from streamsched import App, CommandContext, Selection, Turn, external_command

app = App("crashloop")


@external_command()
async def explode(ctx: CommandContext) -> None:
    with open(os.environ["CRASHLOOP_LOG"], "a") as log:
        log.write(f"{ctx.ordinal}\n")
        log.flush()
        os.fsync(log.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


@app.scheduler(name=os.environ.get("CRASHLOOP_NAME", "crashloop"),
               topic=os.environ.get("CRASHLOOP_TOPIC", "x"), selection=Selection("due", type="due"),
               commands=[explode], claim_duration_s=5)
async def handle(turn: Turn) -> None:
    await turn.commands.explode()
