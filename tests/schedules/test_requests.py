"""``schedule trigger`` and ``schedule backfill`` on a real broker, with a running ticker and a
target worker that counts its effects per occurrence identity.

The ticker's clock is under test control and sits two minutes in the past (the target worker
runs on real time and defers occurrences due in the future).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from streamsched.schedules.catalog import Catalog
from streamsched.schedules.manual import BackfillTooLarge
from streamsched.testing import ROOT
from streamsched.worker.intake import Worker
from tests.schedules.test_schedules import Clock, counting_target, occurrences, same_partition, ticking, until

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]
S = 10**9


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("req"), partitions=2)
    await cat.ensure_topics()
    return cat


async def test_trigger_and_backfill_run_each_identity_once(catalog: Catalog, make_topic, unique) -> None:
    target = await make_topic("jobs")
    t0 = (time.time_ns() // S - 120) * S
    clock = Clock(t0)
    occ = [f"job.v1/{t0 + k * S}" for k in range(7)]

    async with counting_target(catalog, target, unique("s").replace("-", "_")) as tgt:
        worker, effects = tgt.worker, tgt.calls

        async def ran(*ids: str) -> bool:
            return all(effects[i] >= 1 for i in ids)

        await catalog.schedule("job", "@every 1s", target, policy="coalesce")
        async with ticking(catalog, clock):
            await until(lambda: _state(catalog), "state")
            clock.now = t0 + 3 * S  # coalesce: t0+3s fires, t0+1s and t0+2s are skipped
            await until(lambda: ran(occ[3]), "t0+3s ran", 60)
            clock.now = t0 + 6 * S
            await until(lambda: ran(occ[6]), "t0+6s ran", 60)

            manual = await catalog.trigger("job")
            [manual_id] = manual.occurrences
            await until(lambda: ran(manual_id), "the manual run", 60)
            # The manual run's result comes back as trusted feedback, shown as manual.
            await until(lambda: _history_has(catalog, manual_id, "SUCCEEDED"), "manual feedback", 60)

            receipt = await catalog.backfill("job", t0 + S, t0 + 6 * S)
            assert receipt.occurrences == occ[1:7] and receipt.count == 6
            await until(lambda: ran(*occ[1:7]), "the backfilled runs", 60)
            # t0+3s and t0+6s had run: their outcome is stored, so they resolve without an effect.
            await until(lambda: _skipped_outcome(worker, 2), "the two repeats resolved", 60)
            state = (await catalog.states())["job"]
            assert (state.anchor_ns, state.next_planned_ns) == (t0 + 6 * S, t0 + 7 * S)  # unmoved
    assert effects == Counter({i: 1 for i in [*occ[1:7], manual_id]})
    rows = await catalog.history("job")
    tags = Counter(r.manual for r in rows if r.state == "RUNNING")
    assert tags == {None: 2, "trigger": 1, "backfill": 6}
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "streamsched", "schedule", "history", "job",
                         "--catalog", catalog.name, "--bootstrap", catalog.bootstrap],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    # Manual RUNNING rows are tagged, and so is the trigger's result row (its identity is its own).
    assert next(line for line in lines if manual_id in line and "SUCCEEDED" in line).endswith("[trigger]")
    assert sum(line.endswith("[backfill]") for line in lines) == 6
    assert sum(line.endswith("[trigger]") for line in lines) == 2
    running_6 = [line for line in lines if occ[6] in line and "RUNNING" in line]
    assert [line.endswith("RUNNING") for line in running_6] == [True, False]  # the scheduled run, untagged


async def test_a_request_made_while_no_ticker_runs_fires_once_across_restarts(catalog: Catalog,
                                                                              make_topic) -> None:
    target, beats = await make_topic("occ"), await make_topic("beat")
    clock = Clock(1_800_000_000 * S)
    await catalog.schedule("job", "@every 1h", target)
    # A sentinel on job's partition: its occurrence at a time proves a tick at that time.
    beat = same_partition(catalog, "job")
    await catalog.schedule(beat, "@every 1s", beats)
    async with ticking(catalog, clock):
        await until(lambda: _state(catalog), "state")
    # No ticker runs now; the command line's receipt names the occurrence.
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "streamsched", "schedule", "trigger", "job",
                         "--catalog", catalog.name, "--bootstrap", catalog.bootstrap],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert (receipt["trigger"], receipt["count"], receipt["schedule_id"]) == (True, 1, "job.v1")
    [manual_id] = receipt["occurrences"]
    async with ticking(catalog, clock):
        await until(lambda: _fired(catalog.bootstrap, target, manual_id), "the trigger fired")
    async with ticking(catalog, clock):  # restored: the request is applied, not pending
        await until(lambda: _state(catalog), "state")
        clock.now += S
        # A tick of the restored ticker, at a later time, in which it must not fire again.
        await until(lambda: _fired(catalog.bootstrap, beats, f"{beat}.v1/{clock.now}"), "a later tick")
    assert await occurrences(catalog.bootstrap, target) == [manual_id]


async def test_applied_requests_are_cleaned_up_by_the_next_write_and_by_rm(
        catalog: Catalog, make_topic, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.schedules import manual

    target = await make_topic("occ")
    clock = Clock(1_800_000_000 * S)
    await catalog.schedule("job", "@every 1h", target)
    monkeypatch.setattr(manual, "KEEP_REQUESTS", 0)
    async with ticking(catalog, clock):
        await until(lambda: _state(catalog), "state")
        first = await catalog.trigger("job", at_ns=clock.now + 5 * S)
        await until(lambda: _fired(catalog.bootstrap, target, first.occurrences[0]), "first fired")
        await until(lambda: _applied(catalog), "the applied offset moved past it")
        second = await catalog.trigger("job", at_ns=clock.now + 6 * S)
        assert await _request_ids(catalog) == {second.request_id}  # the applied one is deleted
        await until(lambda: _fired(catalog.bootstrap, target, second.occurrences[0]), "second fired")
    assert await catalog.unschedule("job")
    assert await _request_ids(catalog) == set()


async def test_backfill_bounds_and_dry_run(catalog: Catalog, make_topic) -> None:
    target = await make_topic("occ")
    await catalog.schedule("minutely", "@every 1m", target)
    t = (time.time_ns() // (60 * S) - 200) * 60 * S
    with pytest.raises(BackfillTooLarge) as refused:
        await catalog.backfill("minutely", t, t + 100 * 60 * S)
    assert "--max" in str(refused.value) and (refused.value.actual, refused.value.limit) == (101, 64)
    dry = await catalog.backfill("minutely", t, t + 100 * 60 * S, max=101, dry_run=True)
    assert dry.count == 101 and dry.request_id is None and len(dry.occurrences) == 101
    base = [sys.executable, "-m", "streamsched", "schedule", "backfill", "minutely",
            "--catalog", catalog.name,
            "--bootstrap", catalog.bootstrap,
            "--from", _rfc3339(t), "--to", _rfc3339(t + 100 * 60 * S)]
    proc = await asyncio.to_thread(subprocess.run, base, cwd=ROOT, capture_output=True, text=True,
                                   timeout=120)
    assert proc.returncode == 2 and "raise --max" in proc.stderr, proc.stderr
    proc = await asyncio.to_thread(subprocess.run, [*base, "--max", "200", "--dry-run"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["count"] == 101 and out["request"] is None and out["occurrences"][0] == f"minutely.v1/{t}"
    with pytest.raises(Exception, match="future"):
        await catalog.backfill("minutely", t, time.time_ns() + 3600 * S)


def _rfc3339(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _state(catalog: Catalog) -> bool:
    return "job" in await catalog.states()


async def _fired(bootstrap: str, topic: str, event_id: str) -> bool:
    return event_id in await occurrences(bootstrap, topic)


async def _request_ids(catalog: Catalog) -> set[str]:
    requests: dict[str, Any] = {}
    await catalog._latest(catalog.definitions_topic, lambda v: v, requests)
    return {r.request.request_id for r in requests.values()}


async def _applied(catalog: Catalog) -> bool:
    offsets = await catalog._applied_offsets(set(range(catalog.partitions)))
    return sum(offsets.values()) >= 2  # the definition and the request


async def _history_has(catalog: Catalog, occurrence: str, state: str) -> bool:
    return any(r.occurrence == occurrence and r.state == state for r in await catalog.history("job"))


async def _skipped_outcome(worker: Worker, n: int) -> bool:
    return worker.metrics.snapshot()["counters"].get("skipped_outcome", 0) >= n

