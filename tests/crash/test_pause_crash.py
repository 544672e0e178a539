"""A pause survives its owner's death: real worker processes, SIGKILL.

The pause is committed (the control topic holds it) and the worker that applied it is killed;
a worker started afterwards reads the control topic before its first claim, so it starts paused:
it owns the partitions and sees the new records (its lag counts them) and runs none of them
until the scheduler is resumed, then runs each exactly once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import free_port
from streamsched.ops.pause import pause_state, request_pause
from streamsched.ops.status import fetch_status
from streamsched.testing import WorkerProcess, make_event, produce_events, wait_drained, wait_for
from tests.security.operator_app import make_app, runs

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

APP_REF = "tests.security.operator_app:app"


async def _gauges(url: str) -> dict[str, float]:
    try:
        doc = await fetch_status(url)
    except Exception:  # noqa: BLE001 - not serving yet
        return {}
    return {k: v for s in doc["schedulers"] for k, v in s["gauges"].items()}


async def test_a_worker_started_after_its_paused_owner_was_killed_starts_paused(
        bootstrap: str, tmp_path: Path) -> None:
    ns = uuid.uuid4().hex[:6]
    env = {"OPERATOR_SCHED": f"pause_{ns}", "OPERATOR_TOPIC": f"pause-{ns}",
           "OPERATOR_RUNS_FILE": str(tmp_path / "runs"), "STREAMSCHED_SESSION_TIMEOUT": "6s"}
    sched = make_app(env["OPERATOR_SCHED"], env["OPERATOR_TOPIC"]).one()
    await apply(bootstrap, [TopicSpec(sched.topic, 2, 1, "transition"), *sched.internal_topics(2, 1)])

    port = free_port()
    first = WorkerProcess(APP_REF, bootstrap, env={**env, "STREAMSCHED_STATUS_PORT": str(port)},
                          log_path=tmp_path / "first.log").start()
    url = f"http://127.0.0.1:{port}"
    await produce_events(bootstrap, sched.topic, [make_event("due", "acme", ["before"])])

    async def ran_before() -> bool:
        assert first.alive(), first.log_tail()
        return [t for t, _ in runs(tmp_path / "runs")] == ["before"]

    await wait_for(ran_before, timeout=120, what="the first worker to run an item")
    # Its offset committed too: killed before that, the item's record would be read again by the
    # next worker and wait, paused, beside the new ones (a lag of 6, not 5).
    await wait_drained(bootstrap, sched.group, sched.topic, timeout=60)
    await request_pause(bootstrap, sched.name, paused=True, reason="downstream maintenance")

    async def first_paused() -> bool:
        return (await _gauges(url)).get("paused") == 1

    await wait_for(first_paused, timeout=60, what="the first worker to apply the pause")
    first.kill()
    first.wait_killed()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    second = WorkerProcess(APP_REF, bootstrap, env={**env, "STREAMSCHED_STATUS_PORT": str(port)},
                           log_path=tmp_path / "second.log").start()
    try:
        targets = [f"after-{i}" for i in range(5)]
        await produce_events(bootstrap, sched.topic, [make_event("due", "acme", [t]) for t in targets])

        seen: dict[str, float] = {}

        async def sees_them_paused() -> bool:
            assert second.alive(), second.log_tail()
            seen.clear()
            seen.update(await _gauges(url))
            return seen.get("paused") == 1 and seen.get("partitions") == 2 and seen.get("lag") == len(targets)

        # Up to a transaction timeout (60 s) and the broker's abort sweep: a worker killed with a
        # transaction open holds its partitions' stable offsets until the broker aborts it.
        try:
            await wait_for(sees_them_paused, timeout=240,
                           what="the restarted worker to own both partitions, paused, with 5 records behind")
        except TimeoutError:
            raise AssertionError(f"last gauges {seen}\n{second.log_tail(40)}") from None
        assert [t for t, _ in runs(tmp_path / "runs")] == ["before"]  # none of them ran
        assert (await pause_state(bootstrap, sched.name)).paused

        await request_pause(bootstrap, sched.name, paused=False, reason="done")

        async def all_ran() -> bool:
            assert second.alive(), second.log_tail()
            return len(runs(tmp_path / "runs")) == 1 + len(targets)

        await wait_for(all_ran, timeout=120, what="every item to run after the resume")
    finally:
        assert second.terminate() == 0, second.log_tail()
    counts = Counter(t for t, _ in runs(tmp_path / "runs"))
    assert counts == Counter(["before", *targets])  # each exactly once
