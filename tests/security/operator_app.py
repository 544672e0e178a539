"""The app of the operator-role test (tests/security/test_acl_operator.py), run by a worker process.

Its names come from the environment so each test run has its own topics, group and principal
bindings; its one command fails terminally while the file ``OPERATOR_FAIL_FILE`` exists (the
bug) and appends the target to ``OPERATOR_RUNS_FILE`` on every run.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.retry import Terminal

NAME = os.environ.get("OPERATOR_SCHED", "operator_app")
TOPIC = os.environ.get("OPERATOR_TOPIC", "operator-app")

app = App("operator")


@external_command()
async def charge(ctx: CommandContext, *, target: str) -> None:
    runs = os.environ.get("OPERATOR_RUNS_FILE")
    if runs:
        with Path(runs).open("a") as f:
            f.write(f"{target} {ctx.fence}\n")
    fail = os.environ.get("OPERATOR_FAIL_FILE")
    if fail and Path(fail).exists():
        raise Terminal("the bug")


@app.scheduler(name=NAME, topic=TOPIC, selection=Selection("due", type="due"), commands=[charge],
               claim_duration_s=5)
async def handle(turn: Turn) -> None:
    await turn.commands.charge(target=turn.event.target[0])
