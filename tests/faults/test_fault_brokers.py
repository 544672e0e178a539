"""Broker faults on a fresh three-node cluster (tests/faults/fault_harness.py), each under a
steady load with two workers, audited like the network scenarios.

1. ``kill -9`` of a broker that leads partitions of the transition topic (not the group's
   coordinator), restarted at once: the cluster elects around it, the workers keep resolving
   work on the other two, the broker rejoins every ISR, leaders return to it (preferred-leader
   election, :data:`~tests.faults.conftest.BROKER_FAULT_CONFIG`) and the workers follow them.
2. ``kill -9`` of the broker that coordinates both the workers' group and the transactions of
   some of their partitions' owners; it stays down: both coordinators move to the other two
   brokers and the workers resolve everything there.
3. That same kind of broker paused (SIGSTOP) for 30 s, then continued (SIGCONT). A stopped
   broker keeps its connections open and never answers, so every request to it waits for its
   bound, until Kafka fences it and leaders and coordinators move; once it is back, leaders
   return to it behind every client's cached metadata. (A consumer that kept asking the old
   leader for an offset once stalled whole workers for minutes after such a pause; the client
   mechanism itself is pinned down in tests/ops/test_paused_broker.py.)

Each scenario: every identity one effect, none executed again after its outcome was stored,
fences rising, no call after its lease moved on, offsets never ahead of outcomes (during the
fault and once the group is stopped), progress within :data:`PROGRESS_S` of the fault, every
worker error line and owner failure explained (:mod:`tests.faults.fault_logs`), owner restarts
within the scenario's bound, and its recovery times in its ``FAULT-RESULT`` line. The second
one also stops its whole group while the broker is still down and the load still comes, and
checks atomicity itself there: once nothing is in flight, no committed offset leads its
outcomes (:func:`~tests.faults.fault_audit.offsets_ahead_at_rest`; then two fresh workers
resolve the rest).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from streamsched.testing import wait_drained, wait_for
from tests.faults.fault_audit import (
    Record,
    assert_clean_logs,
    audit,
    committed_ahead,
    offsets_ahead_at_rest,
    report,
)
from tests.faults.fault_harness import PARTITIONS, PROGRESS_S, Scenario
from tests.faults.fault_logs import BROKER_DOWN_ERRORS, BROKER_FAULT_OWNERS, RestartBound

pytestmark = [pytest.mark.faults, pytest.mark.kafka]

PAUSE_S = 30.0
"""How long a broker stays stopped: past Kafka's 9 s broker session timeout (it is fenced and
its roles move) and several worker sessions (3 s) and leases (5 s)."""
ONE_PER_PARTITION = ("each partition's owner may fail once for the fault -- a send or a transaction held by "
                     "the lost broker outlasting its bound (KafkaTimeoutError, TransactionStuck) -- and its "
                     "fresh producer finds the new leader and coordinator (aiokafka follows moves itself: "
                     "none restarted in the runs that set this). More is a restart loop")
KILLED_LEADER_RESTARTS = RestartBound(PARTITIONS, ONE_PER_PARTITION)
KILLED_COORDINATOR_RESTARTS = RestartBound(PARTITIONS, ONE_PER_PARTITION)
"""The group stopped and started again mid-fault restarts no owner: its workers are new processes."""
PAUSED_COORDINATOR_RESTARTS = RestartBound(PARTITIONS, ONE_PER_PARTITION)


async def _warm(sc: Scenario) -> None:
    """Two workers, and every partition resolving work."""
    sc.worker("wa"), sc.worker("wb")
    await sc.feed(6)
    await sc.recovery("warmup", timeout=90)


async def _roles(sc: Scenario, node: int) -> dict[str, Any]:
    """What ``node`` does for the workers (for the result line)."""
    found = await sc.coordinators()
    return {"victim": node, "group_coordinator": found.group == node,
            "transactions_of": sorted(p for p, n in found.transactions.items() if n == node),
            "leads": sorted(f"{p['topic']}[{p['partition']}]" for p in await sc.replicas()
                            if p["leader"] == node)}


async def _leads_again(sc: Scenario, node: int, since: float) -> None:
    """Until preferred-leader election gives ``node`` back a partition it led before the fault."""
    async def leads() -> bool:
        try:
            return any(p["leader"] == node for p in await sc.replicas())
        except Exception:  # noqa: BLE001 - a request may time out while leaders move: poll again
            return False

    await wait_for(leads, timeout=PROGRESS_S, what=f"leaders to return to broker {node}")
    sc.marks["leaders_back"] = round(time.monotonic() - since, 2)


async def _rejoined(sc: Scenario, node: int, since: float) -> None:
    await wait_for(lambda: sc.in_sync(node), timeout=PROGRESS_S, what=f"broker {node} back in every ISR")
    sc.marks["broker_rejoin"] = round(time.monotonic() - since, 2)


async def _elected_around(sc: Scenario, node: int, since: float, timeout: float = PROGRESS_S) -> None:
    await wait_for(lambda: sc.elected_around(node), timeout=timeout,
                   what=f"leaders to move off broker {node}")
    sc.marks["elected_around"] = round(time.monotonic() - since, 2)


async def _stop_and_audit(sc: Scenario, record: Record, name: str, restarts: RestartBound, *,
                          stopped: tuple[str, ...] = (), **extra: Any) -> None:
    """Everything produced resolved (parked work too), the workers (but those ``stopped``
    already) stopped cleanly, the audit, the logs and ``restarts``."""
    await sc.recovery("after_load")
    await wait_drained(sc.bootstrap, sc.wf.group, sc.wf.topic, timeout=PROGRESS_S)
    for worker, w in sc.workers.items():
        if worker in stopped:
            continue
        assert w.alive(), f"{worker} died:\n{w.log_tail(40)}"
        assert w.terminate() == 0, worker
    result = await audit(sc)
    report(sc, name, result, record, **extra)
    assert result.ok, result.failures()
    assert_clean_logs(sc, restarts=restarts, allow=[BROKER_DOWN_ERRORS, BROKER_FAULT_OWNERS])


async def test_a_killed_partition_leader_is_elected_around_and_followed_after_its_restart(
        broker_scenario: Scenario, record_property: Record) -> None:
    sc = broker_scenario
    await _warm(sc)
    found = await sc.coordinators()
    leads = Counter(p["leader"] for p in await sc.replicas() if p["topic"] == sc.wf.topic)
    # Not the group coordinator (the next scenario's victim); of the others leading transition
    # partitions, the one coordinating the fewest owners' transactions: a leader's loss alone.
    victim = min((n for n in leads if n != found.group),
                 key=lambda n: (list(found.transactions.values()).count(n), -leads[n]))
    roles = await _roles(sc, victim)

    async with sc.load():  # through the kill, the restart and the leaders' return
        await sc.flowing()
        before = await sc.lag()
        killed = time.monotonic()
        sc.kill_broker(victim)
        # Timed from the kill, polled while the broker is down and coming back up.
        progress = asyncio.create_task(sc.recovery("progress", since=(killed, dict(before.end))))
        try:
            await _elected_around(sc, victim, killed)
            # Restarted at once, as a supervisor would: it takes Kafka tens of seconds to be back,
            # so the workers progress without it first.
            sc.restart_broker(victim)
            restarted = time.monotonic()
            await progress
        finally:
            progress.cancel()
        assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
        await _rejoined(sc, victim, restarted)
        await _leads_again(sc, victim, restarted)
        await sc.recovery("after_leaders_back")  # what the group held when leaders returned
        assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
    await _stop_and_audit(sc, record_property, "broker_leader_killed_restarted", KILLED_LEADER_RESTARTS,
                          **roles)


async def test_a_killed_group_and_transaction_coordinator_hands_both_over(
        broker_scenario: Scenario, record_property: Record) -> None:
    sc = broker_scenario
    await _warm(sc)
    victim = (await sc.coordinators()).group
    roles = await _roles(sc, victim)
    assert roles["transactions_of"], f"the victim must coordinate transactions too: {roles}"

    async with sc.load():  # through the kill and on two brokers to the end
        await sc.flowing()
        before = await sc.lag()
        killed = time.monotonic()
        sc.kill_broker(victim)
        await _elected_around(sc, victim, killed)

        async def handed_over() -> bool:
            try:
                moved = await sc.coordinators()
            except Exception:  # noqa: BLE001 - a lookup may fail while the roles move: poll again
                return False
            return moved.group != victim and victim not in moved.transactions.values()

        await wait_for(handed_over, timeout=PROGRESS_S - (time.monotonic() - killed),
                       what=f"the group and transaction coordinators to leave broker {victim}")
        sc.marks["coordinators_moved"] = round(time.monotonic() - killed, 2)
        await sc.recovery("progress", since=(killed, dict(before.end)))  # timed from the kill
        assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
        # The whole group stopped while the broker is still down and the load still comes; once
        # the transactions it began have ended, nothing is in flight: atomicity itself.
        for name in ("wa", "wb"):
            assert sc.workers[name].terminate() == 0, name
        assert await offsets_ahead_at_rest(sc) == [], "a committed offset leads its outcomes"
        sc.worker("wc"), sc.worker("wd")  # a fresh group resolves the rest, on two brokers
    await _stop_and_audit(sc, record_property, "broker_coordinators_killed", KILLED_COORDINATOR_RESTARTS,
                          stopped=("wa", "wb"), **roles)


async def test_a_paused_coordinator_is_worked_around_and_followed_after_it_resumes(
        broker_scenario: Scenario, record_property: Record) -> None:
    sc = broker_scenario
    await _warm(sc)
    victim = (await sc.coordinators()).group  # it also coordinates transactions (the fixture)
    roles = await _roles(sc, victim)

    async with sc.load():  # through the pause, the resume and the leaders' return
        await sc.flowing()
        before = await sc.lag()
        paused = time.monotonic()
        # Timed from the pause, polled through it: progress made while the broker is stopped
        # counts; the bound runs PROGRESS_S past the resume.
        progress = asyncio.create_task(sc.recovery("progress", since=(paused, dict(before.end)),
                                                   timeout=PAUSE_S + PROGRESS_S))
        try:
            async with sc.paused(victim):
                await _elected_around(sc, victim, paused, timeout=PAUSE_S)
                await asyncio.sleep(max(0.0, PAUSE_S - (time.monotonic() - paused)))  # the fault's length
            resumed = time.monotonic()
            at_resume = dict((await sc.lag()).end)
            await progress
        finally:
            progress.cancel()
        sc.marks["paused_s"] = round(resumed - paused, 2)
        await sc.recovery("after_resume", since=(resumed, at_resume))  # held at the resume
        assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
        await _rejoined(sc, victim, resumed)
        await _leads_again(sc, victim, resumed)
        await sc.recovery("after_leaders_back")
        assert await committed_ahead(sc) == [], "offset committed ahead of outcomes"
    await _stop_and_audit(sc, record_property, "broker_coordinators_paused", PAUSED_COORDINATOR_RESTARTS,
                          **roles)
