"""``streamsched cancel`` on a real broker, with a running worker.

An event is due in an hour: the worker defers it to the delay topic (nothing is claimed yet).
The operator cancels it by its event; the owner stores the cancelled outcome, ``inspect`` shows
``CANCELLED`` with the audit entry, a second cancel is refused before anything is sent, and
``redrive`` reopens the identity without ``--force``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.ops.cli import load_app, main
from streamsched.ops.inspect import inspect_identity
from streamsched.testing import make_event, produce_events, running_worker, wait_for
from tests.conftest import TopicFactory

pytestmark = [pytest.mark.kafka]

SUFFIX = uuid.uuid4().hex[:8]
RUNS: Counter[str] = Counter()
APP = App("cancel")


@external_command()
async def charge(ctx: CommandContext, *, target: str) -> None:
    RUNS[target] += 1


@APP.scheduler(name=f"cancel_{SUFFIX}", topic=f"cancel-{SUFFIX}", selection=Selection("due", type="due"),
               commands=[charge], claim_duration_s=5)
async def handle(turn: Turn) -> None:
    await turn.commands.charge(target=turn.event.target[0])


def holds(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))
    return code, capsys.readouterr().out


def report(out: str) -> Any:
    [line] = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(line)


async def test_an_event_waiting_for_its_due_time_is_cancelled_and_never_runs(
        bootstrap: str, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref = "tests.ops.test_cancel:APP"
    mod = importlib.import_module("tests.ops.test_cancel")  # the module the CLI loads the app from
    sched = load_app(ref).one()
    mod.RUNS.clear()
    await make_topic(name=sched.topic, partitions=2)
    due = time.time_ns() + 3600 * 10**9  # an hour from now
    later = make_event("due", "acme", ["inv-later"], due_ns=due)
    now = make_event("due", "acme", ["inv-now"])
    await produce_events(bootstrap, sched.topic, [later, now])
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", bootstrap)
    doc = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-later"], "due_ns": due})
    async with running_worker(sched, bootstrap) as worker:
        await wait_for(holds(lambda: worker.metrics.counters.get("deferred_until_due", 0) >= 1
                             and mod.RUNS["inv-now"] == 1), timeout=90, what="the event deferred")

        code, out = await run_cli(capsys, "cancel", "--app", ref, "--event", doc, "--reason", "plan changed",
                                  "--dry-run")
        assert code == 0 and report(out)["requested"] == 1 and report(out)["dry_run"] is True
        assert not (await inspect_identity(bootstrap, sched, event=later)).found  # nothing was sent

        code, out = await run_cli(capsys, "cancel", "--app", ref, "--event", doc, "--reason", "plan changed")
        assert code == 0 and report(out)["requested"] == 1

        async def cancelled() -> bool:
            return (await inspect_identity(bootstrap, sched, event=later)).cancelled

        await wait_for(cancelled, timeout=60, what="the owner to store the cancel")
        view = await inspect_identity(bootstrap, sched, event=later)
        assert view.to_dict()["outcome"] == "FAILED" and view.to_dict()["cancelled"] is True
        assert view.resolved and view.error_kind == "operator_cancelled"
        [entry] = view.audit
        assert (entry.action, entry.result, entry.reason) == ("cancel", "cancelled", "plan changed")
        assert entry.principal.startswith("local:")
        code, out = await run_cli(capsys, "inspect", "--app", ref, "--event", doc, "-o", "table")
        assert code == 0 and "CANCELLED" in out and "cancel " in out and "FAILED" not in out
        assert worker.metrics.counters.get("cancelled") == 1

        # Resolved now: nothing waits, so nothing is sent. A never-seen bare identity is not found.
        code, out = await run_cli(capsys, "cancel", "--app", ref, "--event", doc, "--reason", "again")
        assert code == 0 and report(out)["requested"] == 0
        assert report(out)["refused"] == {"nothing_waiting": 1}
        code, out = await run_cli(capsys, "cancel", "--app", ref, "--identity", "sched_" + "0" * 64,
                                  "--reason", "typo")
        assert code == 0 and report(out)["refused"] == {"not_found": 1}

        # A cancelled identity is a FAILED outcome: re-driven without --force.
        code, out = await run_cli(capsys, "redrive", "--app", ref, "--identity", view.identity,
                                  "--reason", "plan back on")
        assert code == 0 and report(out)["requested"] == 1

        async def reopened() -> bool:
            v = await inspect_identity(bootstrap, sched, event=later)
            return v.outcome is None and len(v.audit) == 2

        await wait_for(reopened, timeout=60, what="the owner to reopen it")
    assert dict(mod.RUNS) == {"inv-now": 1}  # the hour-ahead event never ran
