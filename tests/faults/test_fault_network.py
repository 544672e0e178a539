"""Network faults made with namespaces and nftables (see tests/faults/fault_harness.py).

1. A live worker cut off from every broker (not paused: its process keeps running, its
   connections hang): the group evicts it, the other worker takes its partitions over and
   executes; the cut-off worker never executes after its lease moved on, and once the network
   returns it rejoins the group and works again (no crash loop, nothing lost).
2. One broker cut off from the other two (clients still reach it): the cluster elects around it,
   the workers keep progressing, nothing is lost or run twice, and the broker rejoins (full ISR)
   once the cut is lifted.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from streamsched.kafka.txn import TXN_DEADLINE_S
from streamsched.testing import wait_drained, wait_for
from tests.faults.fault_audit import (
    Record,
    assert_clean_logs,
    audit,
    committed_ahead,
    report,
)
from tests.faults.fault_harness import PARTITIONS, PROGRESS_S, Scenario
from tests.faults.fault_logs import BROKER_FAULT_OWNERS, CUT_BROKER_ERRORS, RestartBound

pytestmark = [pytest.mark.faults, pytest.mark.kafka]

CUT_S = 20.0
"""How long a cut lasts: several session timeouts (3 s) and leases (5 s)."""
CUT_OFF_WORKER_RESTARTS = RestartBound(2 * PARTITIONS, (
    "the cut-off worker's owners (about half the partitions) may fail on a request it cannot send "
    "and restart with backoff until the group evicts it (seconds), and each fenced one restarts once "
    "if no revoke confirms the fence within 30 s; the survivor none (none in the runs that set this)"))
CUT_OFF_BROKER_RESTARTS = RestartBound(2 * PARTITIONS, (
    "each partition's owner may restart once for a transaction the deposed broker holds (given up at "
    "its deadline) or an EndTxn it answers UNKNOWN_SERVER_ERROR, and once more for a restore refused "
    "for its stale log (ChangelogBehind) or a fence no revoke confirms (none in the runs that set this)"))


async def test_a_worker_cut_off_from_every_broker_is_fenced_and_rejoins(
        scenario: Scenario, record_property: Record) -> None:
    sc = scenario
    cut_off, survivor = sc.worker("wa"), sc.worker("wb")
    await sc.feed(6)
    await sc.recovery("warmup", timeout=90)
    owners = await sc.owners_since(0)
    assert owners["wa"] and owners["wb"], f"both workers must own partitions before the cut: {owners}"

    async with sc.load():  # through the cut, the heal and the rejoin
        await sc.flowing()
        cut_ns = time.time_ns()
        sc.net.cut("wa", ["b1", "b2", "b3"])
        try:
            await sc.recovery("takeover")  # the survivor resolves what the cut-off one had
            assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
            await asyncio.sleep(max(0.0, CUT_S - (time.time_ns() - cut_ns) / 1e9))
            taken = await sc.owners_since(cut_ns)
            assert cut_off.alive(), "the cut-off worker died instead of waiting for the network"
        finally:
            sc.net.heal("wa")
        healed_ns = time.time_ns()
        healed = time.monotonic()

        async def rejoined() -> bool:
            return (await sc.owners_since(healed_ns))["wa"] > 0

        await wait_for(rejoined, timeout=PROGRESS_S, what="the cut-off worker to claim work again")
        sc.marks["rejoin"] = round(time.monotonic() - healed, 2)
    await sc.recovery("after_heal")
    await wait_drained(sc.bootstrap, sc.wf.group, sc.wf.topic, timeout=PROGRESS_S)  # parked work too
    assert cut_off.alive() and survivor.alive()
    assert cut_off.terminate() == 0 and survivor.terminate() == 0

    result = await audit(sc)
    log = (sc.tmp / "wa.log").read_text(errors="replace")
    # Fenced: whatever the cut-off worker had begun and tried to commit once the network was
    # back was refused (no claim of its from the cut became visible).
    zombie = (await sc.owners_since(cut_ns, healed_ns))["wa"]
    report(sc, "worker_cut_off", result, record_property, claims_during_cut=dict(taken),
           cut_off_fenced=log.count("fenced out of"))
    assert taken["wb"] > 0 and taken["wa"] == 0, f"claims taken during the cut: {taken}"
    assert zombie == 0, f"{zombie} claims of the cut-off worker from the cut became visible"
    assert result.ok, result.failures()
    assert_clean_logs(sc, restarts=CUT_OFF_WORKER_RESTARTS, allow=[BROKER_FAULT_OWNERS])


async def test_a_broker_cut_off_from_the_other_two_is_elected_around(
        scenario: Scenario, record_property: Record) -> None:
    sc = scenario
    sc.worker("wa"), sc.worker("wb")
    await sc.feed(6)
    await sc.recovery("warmup", timeout=90)
    victim_id = (await sc.coordinators()).group  # the most disruptive one
    victim = f"b{victim_id}"
    others = [f"b{i}" for i in (1, 2, 3) if i != victim_id]
    led = sum(p["leader"] == victim_id for p in await sc.replicas())

    async with sc.load():  # through the cut, the heal and the rejoin
        await sc.flowing()
        sc.view = sc.bootstrap_without(victim)
        before = await sc.lag()
        sc.net.cut(victim, others)
        cut = time.monotonic()
        try:
            await wait_for(lambda: sc.elected_around(victim_id), timeout=PROGRESS_S,
                           what="leaders to move off the victim")
            sc.marks["elected_around"] = round(time.monotonic() - cut, 2)

            async def progressing() -> bool:
                lag = await sc.lag()
                return sum(lag.committed.values()) > sum(before.end.values())

            await wait_for(progressing, timeout=PROGRESS_S - (time.monotonic() - cut),
                           what="the group to resolve work produced before the cut")
            sc.marks["progress"] = round(time.monotonic() - cut, 2)
            # A partition whose transaction the deposed leader holds (an acks=all write it
            # cannot replicate) waits for that transaction's deadline and the owner's restart.
            await sc.recovery("during_cut", since=(cut, dict(before.end)),
                              timeout=TXN_DEADLINE_S + PROGRESS_S)
            assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
            await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - cut)))
        finally:
            sc.net.heal(victim)
        healed = time.monotonic()
        await wait_for(lambda: sc.in_sync(victim_id), timeout=PROGRESS_S,
                       what="the victim back in every ISR")
        sc.marks["broker_rejoin"] = round(time.monotonic() - healed, 2)
        sc.view = ""
    await sc.recovery("after_heal")
    await wait_drained(sc.bootstrap, sc.wf.group, sc.wf.topic, timeout=PROGRESS_S)  # parked work too
    for name, w in sc.workers.items():
        assert w.alive(), f"{name} died"
        assert w.terminate() == 0, name

    result = await audit(sc)
    report(sc, "broker_cut_off", result, record_property, victim=victim_id, partitions_led=led)
    assert result.ok, result.failures()
    # Also no "Future exception was never retrieved": the producer a stuck transaction's owner
    # gave up ends fenced after the restart, and what it fails then is settled (kafka/fencing).
    assert_clean_logs(sc, restarts=CUT_OFF_BROKER_RESTARTS, allow=[BROKER_FAULT_OWNERS, CUT_BROKER_ERRORS])
