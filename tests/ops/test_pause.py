"""Pause and resume a scheduler on a real broker, with an in-process worker and the CLI.

A pause takes no new claim (the records wait, counted in the lag), lets the work in flight finish,
keeps the partitions assigned (no rebalance) and is undone by a resume, after which every waiting
item runs once. Pausing a scheduler the cluster does not have is one line and the bad-input exit
code. The crash test (the owner SIGKILLed while paused) is tests/crash/test_pause_crash.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.ops.pause import pause_history, pause_state, request_pause
from streamsched.testing import make_event, produce_events, running_worker, wait_for
from tests.conftest import TopicFactory

pytestmark = [pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(cwd)])
    return subprocess.run([sys.executable, "-m", "streamsched", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


async def test_a_pause_finishes_work_in_flight_claims_nothing_new_and_a_resume_runs_it_once(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    topic = await make_topic("pause", partitions=2)
    name = unique("pause").replace("-", "_")
    started: Counter[str] = Counter()
    release = asyncio.Event()
    app = App("pauses")

    @external_command()
    async def charge(ctx: CommandContext, *, target: str) -> None:
        started[target] += 1
        if target == "slow":
            await release.wait()

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[charge])
    async def handle(turn: Turn) -> None:
        await turn.commands.charge(target=turn.event.target[0])

    sched = app.schedulers[name]
    async with running_worker(sched, bootstrap) as worker:
        await produce_events(bootstrap, topic, [make_event("due", "acme", ["slow"])])

        async def slow_started() -> bool:
            return started["slow"] == 1

        await wait_for(slow_started, timeout=60, what="the slow item to start")
        paused = await request_pause(bootstrap, name, paused=True, reason="partner maintenance",
                                     principal="User:ops")

        async def worker_paused() -> bool:
            return worker.flow.paused and worker.metrics.gauges.get("paused") == 1

        await wait_for(worker_paused, timeout=30, what="the worker to apply the pause")
        later = [f"later-{i}" for i in range(4)]
        await produce_events(bootstrap, topic, [make_event("due", "acme", [t]) for t in later])
        release.set()  # the item in flight finishes while paused

        async def slow_done_rest_waiting() -> bool:
            return (worker.metrics.counters.get("executions", 0) == 1
                    and worker.metrics.gauges.get("lag") == len(later))

        await wait_for(slow_done_rest_waiting, timeout=60,
                       what="the slow item to finish and the four later ones to wait, counted in the lag")
        assert not any(started[t] for t in later)
        assert worker.metrics.gauges["partitions"] == 2
        state = await pause_state(bootstrap, name)
        assert state.paused and state.last == paused

        await request_pause(bootstrap, name, paused=False, reason="back", principal="User:ops")

        async def all_ran() -> bool:
            return all(started[t] == 1 for t in later) and worker.metrics.gauges.get("lag") == 0

        await wait_for(all_ran, timeout=60, what="the waiting items to run after the resume")
        assert worker.metrics.gauges["paused"] == 0
        assert worker.metrics.counters.get("partition_restarts", 0) == 0
    assert started == Counter({"slow": 1, **{t: 1 for t in later}})
    history = await pause_history(bootstrap, name)
    assert [(r.paused, r.principal, r.reason) for r in history] == [
        (True, "User:ops", "partner maintenance"), (False, "User:ops", "back")]


async def test_pausing_an_unknown_scheduler_is_one_line_and_the_bad_input_code(
        bootstrap: str, tmp_path: Path) -> None:
    proc = await asyncio.to_thread(_cli, "pause", "no_such_scheduler", "--reason", "x",
                                   "--bootstrap", bootstrap, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "no scheduler no_such_scheduler on this cluster" in proc.stderr
    (tmp_path / "oneapp.py").write_text(
        "from streamsched import App, Selection, external_command\n"
        "app = App('one')\n"
        "@external_command()\nasync def c(ctx): return None\n"
        "@app.scheduler(name='known', topic='t', selection=Selection('s'), commands=[c])\n"
        "async def h(turn): await turn.commands.c()\n")
    proc = await asyncio.to_thread(_cli, "resume", "unknown", "--app", "oneapp:app", "--bootstrap", bootstrap,
                                   cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no scheduler named 'unknown'" in proc.stderr
    proc = await asyncio.to_thread(_cli, "pause", "known", "--bootstrap", bootstrap, cwd=tmp_path)
    assert proc.returncode == 2 and "--reason" in proc.stderr  # a pause says why
