"""The app of the re-drive tests that run worker processes (tests/security/test_acl_operator.py,
tests/crash/test_redrive_crash.py).

Its names come from the environment (``OPERATOR_SCHED``, ``OPERATOR_TOPIC``) so each test has its
own topics and group; a test process builds the same scheduler with :func:`make_app` (a module
imported once per process cannot follow the environment). Its one command appends
``<target> <fence>`` to ``OPERATOR_RUNS_FILE`` on every run, sleeps ``OPERATOR_SLEEP_S`` and
fails terminally while the file ``OPERATOR_FAIL_FILE`` exists (the bug).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.retry import Terminal


@external_command()
async def charge(ctx: CommandContext, *, target: str) -> None:
    runs = os.environ.get("OPERATOR_RUNS_FILE")
    if runs:
        with Path(runs).open("a") as f:
            f.write(f"{target} {ctx.fence}\n")
    await asyncio.sleep(float(os.environ.get("OPERATOR_SLEEP_S", "0")))
    fail = os.environ.get("OPERATOR_FAIL_FILE")
    if fail and Path(fail).exists():
        raise Terminal("the bug")


def make_app(name: str, topic: str) -> App:
    app = App("operator")

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[charge],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        await turn.commands.charge(target=turn.event.target[0])

    return app


app = make_app(os.environ.get("OPERATOR_SCHED", "operator_app"),
               os.environ.get("OPERATOR_TOPIC", "operator-app"))


def runs(path: Path) -> list[tuple[str, int]]:
    """The ``(target, fence)`` of every run the command recorded in ``path`` so far."""
    if not path.exists():
        return []
    return [(t, int(f)) for t, f in (line.split() for line in path.read_text().splitlines())]
