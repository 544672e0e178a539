"""``streamsched redrive`` and ``dlq replay --redrive`` on a real broker, with a running worker.

A handler fails terminally for a batch of invoices because of a bug; after the fix the operator
re-drives them: each runs exactly once more, with a fence greater than every earlier one, and
the audit trail (inspect) says who did it and why. A SUCCEEDED outcome is refused without
``--force``; a second run of the same command runs nothing again.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.retry import Terminal
from streamsched.ops.cli import load_app, main
from streamsched.ops.inspect import identity_of, inspect_identity
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from tests.conftest import TopicFactory

pytestmark = [pytest.mark.kafka]

SUFFIX = uuid.uuid4().hex[:8]
BROKEN = {"on": True}
RUNS: Counter[str] = Counter()
FENCES: dict[str, list[int]] = {}
APP = App("redrive")


@external_command()
async def charge(ctx: CommandContext, *, target: str) -> None:
    RUNS[target] += 1
    FENCES.setdefault(target, []).append(ctx.fence)
    if BROKEN["on"]:
        raise Terminal("bug in the charge path")


@APP.scheduler(name=f"redrive_{SUFFIX}", topic=f"redrive-{SUFFIX}", selection=Selection("due", type="due"),
               commands=[charge], claim_duration_s=5)
async def handle(turn: Turn) -> None:
    await turn.commands.charge(target=turn.event.target[0])


def holds(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Any]]:
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_redrive_runs_failed_identities_once_more_through_their_owner(
        bootstrap: str, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref = "tests.ops.test_redrive:APP"
    mod = importlib.import_module("tests.ops.test_redrive")  # the module the CLI loads the app from
    sched = load_app(ref).one()
    mod.BROKEN["on"] = True
    mod.RUNS.clear()
    await make_topic(name=sched.topic, partitions=3)
    events = [make_event("due", "acme", [f"inv-{i}"]) for i in range(6)]
    await produce_events(bootstrap, sched.topic, events)
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", bootstrap)
    async with running_worker(sched, bootstrap):
        await wait_for(holds(lambda: sum(mod.RUNS.values()) == 6), timeout=90)
        await wait_drained(bootstrap, sched.group, sched.topic, timeout=60)  # outcomes committed
        failed = await inspect_identity(bootstrap, sched, event=events[0])
        assert failed.outcome == "FAILED"
        mod.BROKEN["on"] = False  # the fix is deployed

        # One identity by its event, with a reason.
        doc = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-0"], "due_ns": 0})
        code, [report] = await run_cli(capsys, "redrive", "--app", ref, "--event", doc, "--reason", "fix 42")
        assert code == 0 and report["requested"] == 1
        await wait_for(holds(lambda: mod.RUNS["inv-0"] == 2), timeout=60)

        # The rest from the dead-letter topic, reopened and replayed in one step.
        code, lines = await run_cli(capsys, "dlq", "replay", "--scheduler", sched.name, "--redrive",
                                    "--app", ref, "--kind", "terminal", "--reason", "fix 42")
        assert code == 0 and lines[0]["redrive"]["requested"] == 5
        await wait_for(holds(lambda: all(mod.RUNS[f"inv-{i}"] == 2 for i in range(6))), timeout=60)
        await wait_drained(bootstrap, sched.group, sched.topic, timeout=60)

        view = await inspect_identity(bootstrap, sched, event=events[0])
        first, second = mod.FENCES["inv-0"]
        assert view.outcome == "SUCCEEDED" and view.outcome_fence == second > first == failed.fence
        assert [(e.result, e.reason) for e in view.audit] == [("reopened", "fix 42")]
        assert view.audit[0].principal.startswith("local:")

        # Succeeded now: refused without --force; nothing is sent, nothing runs.
        code, [again] = await run_cli(capsys, "redrive", "--app", ref, "--from-dlq", "--kind", "terminal")
        assert code == 0 and again["requested"] == 0 and again["refused"] == {"succeeded": 6}
        code, [forced] = await run_cli(capsys, "redrive", "--app", ref, "--identity", view.identity,
                                       "--force", "--reason", "re-run")
        assert code == 0 and forced["requested"] == 1
        async def reopened() -> bool:
            v = await inspect_identity(bootstrap, sched, event=events[0])
            return v.outcome is None and len(v.audit) == 2

        await wait_for(reopened, timeout=60)
        assert mod.RUNS["inv-0"] == 2  # an identity-only re-drive reopens; its next delivery runs
        await produce_events(bootstrap, sched.topic, [events[0]])
        await wait_for(holds(lambda: mod.RUNS["inv-0"] == 3), timeout=60)
    assert sum(mod.RUNS.values()) == 13 and identity_of(sched, events[0]) == view.identity
