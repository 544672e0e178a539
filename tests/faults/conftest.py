"""Fixtures of the fault scenarios on a fresh three-node cluster: a bridge with one namespace per
node, and the cluster on it; both always torn down (workers, brokers, namespaces, rules, bridge)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.faults.fault_harness import Net, Scenario, network, scenario_on


@pytest.fixture
def net() -> Iterator[Net]:
    with network() as made:
        yield made


@pytest.fixture
async def scenario(net: Net, tmp_path: Path) -> AsyncIterator[Scenario]:
    async with scenario_on(net, tmp_path) as sc:
        yield sc


BROKER_FAULT_CONFIG = {"leader.imbalance.check.interval.seconds": "5"}
"""Kafka's preferred-leader election every 5 s instead of 300 s: once a failed broker is back,
leaders return to it within seconds, behind every client's cached metadata (as they would in
production minutes later), so a scenario sees both moves."""


@pytest.fixture
async def broker_scenario(net: Net, tmp_path: Path) -> AsyncIterator[Scenario]:
    """A scenario for broker faults: leaders return (:data:`BROKER_FAULT_CONFIG`), and one broker
    coordinates both the workers' group and some of their transactions."""
    async with scenario_on(net, tmp_path, config=BROKER_FAULT_CONFIG, coordinators_together=True) as sc:
        yield sc
