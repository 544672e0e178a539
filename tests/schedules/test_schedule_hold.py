"""Pausing one schedule and its overlap policy on a real broker, with a running ticker and a
target worker that counts its calls per occurrence identity.

The ticker's clock is under test control and sits two minutes in the past (the target worker
runs on real time and so executes each occurrence as soon as it arrives).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import pytest

from streamsched.errors import ConfigError
from streamsched.model.overlap import Running
from streamsched.model.schedule import ScheduleStatus
from streamsched.schedules.catalog import Catalog
from streamsched.testing import ROOT
from tests.schedules.test_schedules import (
    Clock,
    beat_at,
    counting_target,
    occurrences,
    same_partition,
    ticking,
    until,
)

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]
S = 10**9


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("hold"), partitions=2)
    await cat.ensure_topics()
    return cat


def cli(catalog: Catalog, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamsched", "schedule", *args, "--catalog", catalog.name,
                           "--bootstrap", catalog.bootstrap], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


async def test_a_paused_schedule_keeps_its_catch_up_position(catalog: Catalog, make_topic) -> None:
    target, beats = await make_topic("occ"), await make_topic("beat")
    t0 = 1_800_000_000 * S
    clock = Clock(t0)
    # All three on one partition: the sentinel's occurrence at a time proves a tick at that time.
    from streamsched.kafka.writer import partition_for_key

    home = partition_for_key(b"job", catalog.partitions)
    merged = next(n for n in (f"merged-{i}" for i in range(100))
                  if partition_for_key(n.encode(), catalog.partitions) == home)
    await catalog.schedule("job", "@every 10s", target)
    await catalog.schedule(merged, "@every 10s", target, policy="coalesce")
    beat = same_partition(catalog, "job")
    await catalog.schedule(beat, "@every 10s", beats)
    ticked_at = beat_at(catalog, beat, beats)

    async with ticking(catalog, clock):
        await until(lambda: _count(catalog, 3), "states")
        clock.now = t0 + 20 * S
        await until(lambda: ticked_at(t0 + 20 * S), "fires at +20 s")
        proc = await asyncio.to_thread(cli, catalog, "pause", "job", "--reason", "db maintenance")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["pause"] is True
        await catalog.pause(merged)
        await until(lambda: _all(catalog, ("job", merged), ScheduleStatus.PAUSED), "paused")
        with pytest.raises(ConfigError, match="no schedule named 'nope'"):
            await catalog.pause("nope")
        assert (await catalog.pause("job")).request_id is None  # already paused: nothing written
        clock.now = t0 + 60 * S
        await until(lambda: ticked_at(t0 + 60 * S), "a tick at +60 s, both paused")
        listed = {i.definition.name: i.as_dict() for i in await catalog.list()}
        assert (listed["job"]["status"], listed["job"]["pause_reason"]) == ("PAUSED", "db maintenance")
    async with ticking(catalog, clock):  # a restarted ticker keeps them paused
        clock.now = t0 + 70 * S
        await until(lambda: ticked_at(t0 + 70 * S), "a tick at +70 s after the restart")
        assert await _fired_of(catalog, target, "job") == [t0 + 10 * S, t0 + 20 * S]
        await catalog.resume("job")
        await catalog.resume(merged)
        await until(lambda: _all(catalog, ("job", merged), ScheduleStatus.ACTIVE), "resumed")
        await until(lambda: _count_fired(catalog, target, "job", 7), "job caught up")
        await until(lambda: _count_fired(catalog, target, merged, 2), "merged coalesced")
    # job caught up every boundary its pause missed, with its own identities; merged coalesced them.
    assert await _fired_of(catalog, target, "job") == [t0 + k * 10 * S for k in range(1, 8)]
    assert await _fired_of(catalog, target, merged) == [t0 + 20 * S, t0 + 70 * S]
    fired = await occurrences(catalog.bootstrap, target)
    assert len(fired) == len(set(fired))
    states = await catalog.states()
    # merged skipped +10 s when the clock first moved, then the four its pause missed but the last.
    assert (states["job"].version, states[merged].skipped) == (1, 5)
    assert (await catalog.resume("job")).request_id is None  # active already: nothing written
    assert await catalog.disable("job")
    with pytest.raises(ConfigError, match="'job' is DISABLED: only an active schedule can be paused"):
        await catalog.pause("job")
    proc = await asyncio.to_thread(cli, catalog, "pause", "no-such")
    assert (proc.returncode, proc.stderr) == (
        2, "streamsched: ConfigError: no schedule named 'no-such' in this catalog\n")


async def test_overlap_skip_and_buffer_one_count_calls(catalog: Catalog, make_topic, unique) -> None:
    target = await make_topic("jobs")
    gate = asyncio.Event()  # the first runs stay unresolved until the test opens the gate
    t0 = (time.time_ns() // S - 120) * S
    clock = Clock(t0)

    def occ(schedule: str, k: int) -> str:
        return f"{schedule}.v1/{t0 + k * S}"

    async with counting_target(catalog, target, unique("s").replace("-", "_"), claim_duration_s=60,
                               gate=gate) as tgt:
        calls = tgt.calls

        async def called(*ids: str) -> bool:
            return all(calls[i] >= 1 for i in ids)

        await catalog.schedule("skip", "@every 1s", target, overlap="skip")
        await catalog.schedule("buffer", "@every 1s", target, overlap="buffer_one")
        async with ticking(catalog, clock):
            await until(lambda: _count(catalog, 2), "states")
            clock.now = t0 + S
            await until(lambda: called(occ("skip", 1), occ("buffer", 1)), "the first runs", 60)
            clock.now = t0 + 4 * S  # 2 s .. 4 s are due while both runs are unresolved
            await until(lambda: _running(catalog, "skip", Running(t0 + S, None, 3)), "skip skipped 3", 60)
            held = Running(t0 + S, t0 + 2 * S, 2)
            await until(lambda: _running(catalog, "buffer", held), "buffer held", 60)
            assert set(calls) == {occ("skip", 1), occ("buffer", 1)}
            listed = {i.definition.name: i.as_dict() for i in await catalog.list()}
            buffer = listed["buffer"]
            assert (buffer["overlap"], buffer["buffered_ns"]) == ("buffer_one", t0 + 2 * S)
            gate.set()
            # The held boundary fires once the run before it resolves, without the clock moving.
            await until(lambda: called(occ("buffer", 2)), "the held boundary", 60)
            await until(lambda: _running(catalog, "skip", Running()), "skip's run resolved", 60)
            clock.now = t0 + 5 * S
            await until(lambda: called(occ("skip", 5), occ("buffer", 5)), "the next boundary", 60)
    assert calls == Counter({occ("skip", 1): 1, occ("skip", 5): 1, occ("buffer", 1): 1, occ("buffer", 2): 1,
                             occ("buffer", 5): 1})
    rows = await catalog.history("skip")
    assert [(r.planned_ns, r.state) for r in rows if r.state == "SKIPPED"] == [(t0 + 2 * S, "SKIPPED")]
    states = await catalog.states()
    assert (states["skip"].skipped, states["buffer"].skipped) == (3, 2)
    proc = await asyncio.to_thread(cli, catalog, "history", "skip")
    assert any(f"skip.v1/{t0 + 2 * S}" in line and "SKIPPED overlap/overlap" in line
               for line in proc.stdout.splitlines()), proc.stdout


async def _count(catalog: Catalog, n: int) -> bool:
    return len(await catalog.states()) >= n


async def _all(catalog: Catalog, names: tuple[str, ...], want: ScheduleStatus) -> bool:
    states = await catalog.states()
    return all(n in states and states[n].status is want for n in names)


async def _running(catalog: Catalog, name: str, want: Running) -> bool:
    st = (await catalog.states()).get(name)
    return st is not None and st.running == want


async def _fired_of(catalog: Catalog, topic: str, name: str) -> list[int]:
    ids = await occurrences(catalog.bootstrap, topic)
    return sorted(int(i.rsplit("/", 1)[1]) for i in ids if i.startswith(f"{name}.v1/"))


async def _count_fired(catalog: Catalog, topic: str, name: str, n: int) -> bool:
    return len(await _fired_of(catalog, topic, name)) >= n
