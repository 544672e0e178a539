"""``streamsched inspect`` on a real broker: one identity's claim after a worker resolved it,
found from the event or from the bare identity, and never printing what the operator did not
pass in."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.ops.cli import load_app, main
from streamsched.ops.inspect import format_view, identity_of, inspect_identity
from streamsched.testing import make_event, produce_events, running_worker, wait_drained
from tests.conftest import TopicFactory, failing_scheduler

pytestmark = [pytest.mark.kafka]

HANDLER_ERROR = "no such account: secret-detail"
"""What a failing handler raises: it must never reach a page, a log or an error."""




async def test_inspect_reports_the_claim_of_a_resolved_identity_and_nothing_else(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    topic = await make_topic("insp", partitions=4)
    sched = failing_scheduler(topic, unique("insp").replace("-", "_"), error=HANDLER_ERROR)
    good = [make_event("due", "tenant-pii", [f"acct-{i}"]) for i in range(6)]
    bad = make_event("due", "tenant-pii", ["bad-acct"])
    await produce_events(bootstrap, topic, [*good, bad])
    async with running_worker(sched, bootstrap):
        await wait_drained(bootstrap, sched.group, topic, timeout=90)

    view = await inspect_identity(bootstrap, sched, event=good[0])
    assert view.found and view.identity == identity_of(sched, good[0])
    assert view.status == "RELEASED" and view.outcome == "SUCCEEDED" and view.resolved
    assert view.fence is not None and view.fence >= 1 and view.ordinal == 1
    assert view.outcome_fence == view.fence and view.error_kind is None and not view.lease_active
    assert view.committed_offset is not None and view.committed_offset >= 1

    failed = await inspect_identity(bootstrap, sched, event=bad)
    assert failed.found and failed.outcome == "FAILED" and failed.error_kind is not None
    # The same identity from its bare digest: every state partition is read until it is found.
    by_identity = await inspect_identity(bootstrap, sched, identity=failed.identity)
    assert (by_identity.partition, by_identity.fence, by_identity.outcome) == (
        failed.partition, failed.fence, failed.outcome)
    text = format_view(failed) + json.dumps(failed.to_dict())
    for secret in ("tenant-pii", "bad-acct", "secret-detail", "no such account"):
        assert secret not in text

    never = make_event("due", "tenant-pii", ["never-sent"])
    missing = await inspect_identity(bootstrap, sched, event=never)
    assert not missing.found and not missing.resolved and missing.partition is not None
    nowhere = await inspect_identity(bootstrap, sched, identity=identity_of(sched, never))
    assert not nowhere.found and nowhere.partition is None


def test_inspect_cli_prints_json_and_refuses_a_malformed_identity(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", "127.0.0.1:1")  # never reached: refused before
    code = main(["inspect", "--app", "tests.ops.test_inspect:APP", "--identity", "sched_XYZ"])
    err = capsys.readouterr().err
    assert code == 2 and "an identity is sched_ and 64 lower-case hex digits" in err
    assert "Traceback" not in err


SUFFIX = uuid.uuid4().hex[:8]
"""Unique per test session: the CLI loads this module's APP by name."""
APP = App("inspect_cli")


@external_command()
async def _noop(ctx: CommandContext) -> None:
    return None


@APP.scheduler(name=f"inspect_cli_{SUFFIX}", topic=f"inspect-cli-{SUFFIX}",
               selection=Selection("due", type="due"), commands=[_noop])
async def _handle(turn: Turn) -> None:
    await turn.commands._noop()


async def test_inspect_cli_on_a_real_broker(bootstrap: str, make_topic: TopicFactory,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    # The app as the CLI loads it (this file may be imported under another module name by pytest).
    sched = load_app("tests.ops.test_inspect:APP").one()
    await make_topic(name=sched.topic, partitions=2)
    ev = make_event("due", "t", ["a"])
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", bootstrap)
    doc = json.dumps({"event_id": ev.event_id, "type": "due", "tenant": "t", "target": ["a"], "due_ns": 0})
    code = await asyncio.to_thread(main, ["inspect", "--app", "tests.ops.test_inspect:APP", "--event", doc,
                                          "-o", "json"])
    captured = capsys.readouterr()
    # No worker of it ever ran: its state topic is missing, said in one line (exit 2).
    assert code == 2 and f"state topic {sched.state_topic} does not exist" in captured.err
    async with running_worker(sched, bootstrap):  # creates the scheduler's topics
        pass
    code = await asyncio.to_thread(main, ["inspect", "--app", "tests.ops.test_inspect:APP", "--event", doc,
                                          "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["scheduler"] == sched.name and out["found"] is False
    assert out["partition"] in (0, 1) and out["identity"] == identity_of(sched, ev)
