"""Tickers killed around their fire-and-advance transaction, frozen inside it (a zombie) while
their partitions move, contending and rebalancing, and in the middle of a backfill: every
occurrence fires exactly once (no duplicate, no gap), read with read_committed."""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.model.schedule import HistoryRow
from streamsched.schedules.catalog import Catalog
from streamsched.testing import WorkerProcess, wait_for
from streamsched.wire.schedule import HISTORY_CODEC
from streamsched.wire.transition import decode_transition

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.schedules]
ENV = {"STREAMSCHED_SESSION_TIMEOUT": "3s", "STREAMSCHED_HEARTBEAT": "0.5s"}
NAMES = [f"s{i}" for i in range(6)]


async def setup(bootstrap: str) -> tuple[Catalog, str]:
    catalog = Catalog(bootstrap, f"crash-{uuid.uuid4().hex[:8]}", partitions=4)
    await catalog.ensure_topics()
    target = f"occ-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(target, 2)])
    for name in NAMES:
        await catalog.schedule(name, "@every 1s", target)
    return catalog, target


def ticker(catalog: Catalog, log: Path, **env: str) -> WorkerProcess:
    return WorkerProcess("", catalog.bootstrap, env={**ENV, **env}, log_path=log,
                         command=["schedule", "tick", "--catalog", catalog.name, "--partitions", "4"])


async def fired_at_least(catalog: Catalog, n: int) -> bool:
    states = await catalog.states()
    return len(states) == len(NAMES) and all(s.fired >= n for s in states.values())


async def assert_exactly_once(bootstrap: str, target: str, catalog: Catalog) -> None:
    per: dict[str, list[int]] = defaultdict(list)
    for rec in await read_topic(bootstrap, target):
        sid, planned = decode_transition(rec.value).event_id.rsplit("/", 1)
        per[sid].append(int(planned))
    assert sorted(per) == [f"{n}.v1" for n in NAMES]
    states = await catalog.states()
    for sid, times in per.items():
        assert len(times) == len(set(times)), f"{sid} fired an occurrence twice"
        ordered = sorted(times)
        assert ordered == list(range(ordered[0], ordered[-1] + 1, 10**9)), f"{sid} skipped a boundary"
        assert states[sid.split(".v")[0]].fired == len(times)


@pytest.mark.parametrize("point", ["tick_before_commit", "tick_after_commit"])
async def test_killed_around_commit(bootstrap: str, tmp_path: Path, point: str) -> None:
    catalog, target = await setup(bootstrap)
    doomed = ticker(catalog, tmp_path / "doomed.log", STREAMSCHED_FAILPOINT=f"{point}:4").start()
    assert await doomed.wait_exit(timeout=60) == -signal.SIGKILL
    survivor = ticker(catalog, tmp_path / "survivor.log").start()
    try:
        await wait_for(lambda: fired_at_least(catalog, 6), timeout=60, what="fires after restart")
    finally:
        assert survivor.terminate() == 0
    await assert_exactly_once(bootstrap, target, catalog)


def stopped(proc: WorkerProcess) -> bool:
    """The process is frozen by SIGSTOP (``T`` in /proc's state)."""
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.parametrize("transactions", ["partition", "worker"])
async def test_a_ticker_frozen_inside_its_transaction_is_fenced(bootstrap: str, tmp_path: Path,
                                                                transactions: str) -> None:
    catalog, target = await setup(bootstrap)
    env = {"STREAMSCHED_TRANSACTIONS": transactions}
    # Frozen with its fourth firing transaction open: occurrences, states and history written.
    zombie = ticker(catalog, tmp_path / "zombie.log", STREAMSCHED_FAILPOINT="tick_before_commit:4:stop",
                    **env).start()
    successor = None
    try:
        async def frozen() -> bool:
            return stopped(zombie)

        await wait_for(frozen, timeout=60, what="the ticker frozen inside its transaction")
        successor = ticker(catalog, tmp_path / "successor.log", **env).start()
        # Its partitions move after the session timeout; the successor waits the frozen
        # transaction out (fenced by id, or aborted by the broker at its timeout) and fires on.
        frozen_at = max(s.fired for s in (await catalog.states()).values())
        await wait_for(lambda: fired_at_least(catalog, frozen_at + 4), timeout=90,
                       what="the successor firing")
        zombie.signal(signal.SIGCONT)  # it commits nothing of what it held; it may rejoin the group

        async def zombie_fenced() -> bool:
            return "fenced out of" in (tmp_path / "zombie.log").read_text(errors="replace")

        await wait_for(zombie_fenced, timeout=60, what="the resumed ticker's transaction refused")
        resumed_at = max(s.fired for s in (await catalog.states()).values())
        await wait_for(lambda: fired_at_least(catalog, resumed_at + 3), timeout=60,
                       what="firing after the resume")
    finally:
        zombie.signal(signal.SIGCONT)
        for proc in (zombie, successor):
            if proc is not None and proc.alive():
                assert proc.terminate() == 0, proc.log_tail()
    await assert_exactly_once(bootstrap, target, catalog)


async def test_contending_tickers_and_rebalance(bootstrap: str, tmp_path: Path) -> None:
    catalog, target = await setup(bootstrap)
    a = ticker(catalog, tmp_path / "a.log").start()
    b = ticker(catalog, tmp_path / "b.log").start()
    c = None
    try:
        await wait_for(lambda: fired_at_least(catalog, 3), timeout=60, what="two tickers firing")
        a.kill()  # its partitions move to b after the session timeout
        await wait_for(lambda: fired_at_least(catalog, 8), timeout=60, what="b alone firing")
        c = ticker(catalog, tmp_path / "c.log").start()  # and some move again, to c
        await wait_for(lambda: fired_at_least(catalog, 12), timeout=60, what="b and c firing")
    finally:
        for p in (a, b, c):
            if p is not None and p.alive():
                assert p.terminate() == 0
    await assert_exactly_once(bootstrap, target, catalog)
    logs = "".join((tmp_path / f"{n}.log").read_text() for n in "abc")
    assert "Traceback" not in logs


@pytest.mark.parametrize("point", ["tick_before_commit", "tick_after_commit"])
async def test_a_backfill_cut_off_by_a_kill_resumes_where_it_was(bootstrap: str, tmp_path: Path,
                                                                  point: str) -> None:
    catalog = Catalog(bootstrap, f"crash-{uuid.uuid4().hex[:8]}", partitions=4)
    await catalog.ensure_topics()
    target = f"occ-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(target, 2)])
    await catalog.schedule("job", "@every 1m", target)
    now = time.time_ns()
    # About 1,200 boundaries: three transactions of at most 512 (MAX_FIRES_PER_TXN).
    receipt = await catalog.backfill("job", now - 1200 * 60 * 10**9, now, max=2000)
    doomed = ticker(catalog, tmp_path / "doomed.log", STREAMSCHED_FAILPOINT=f"{point}:2").start()
    assert await doomed.wait_exit(timeout=120) == -signal.SIGKILL
    cut_off = await fired(bootstrap, target)
    assert 0 < len(cut_off) < receipt.count  # killed midway through the backfill

    async def all_fired() -> bool:
        return set(receipt.occurrences) <= set(await fired(bootstrap, target))

    survivor = ticker(catalog, tmp_path / "survivor.log").start()
    try:
        await wait_for(all_fired, timeout=120, what="the rest of the backfill")
    finally:
        assert survivor.terminate() == 0
    occurrences = Counter(await fired(bootstrap, target))
    assert [occ for occ, n in occurrences.items() if n > 1] == []  # none fired twice
    rows = Counter(r.occurrence for r in await history(bootstrap, catalog, "job") if r.manual == "backfill")
    assert rows == Counter(receipt.occurrences)  # one RUNNING row each: no duplicate history


async def fired(bootstrap: str, target: str) -> list[str]:
    return [decode_transition(rec.value).event_id for rec in await read_topic(bootstrap, target)]


async def history(bootstrap: str, catalog: Catalog, name: str) -> list[HistoryRow]:
    """Every history row of ``name`` ever committed (the raw log, before compaction keeps the last
    256 slots): a row written twice shows twice here."""
    return [HistoryRow.from_record(HISTORY_CODEC.decode(rec.value))
            for rec in await read_topic(bootstrap, catalog.history_topic)
            if rec.value is not None and rec.key is not None and rec.key.startswith(f"{name}/".encode())]
