"""Fixtures of the network fault scenarios: a bridge with one namespace per node, and a fresh
three-node cluster on it; both always torn down (workers, brokers, namespaces, rules, bridge)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.faults.fault_harness import Net, Scenario, make_scenario, network


@pytest.fixture
def net() -> Iterator[Net]:
    with network() as made:
        yield made


@pytest.fixture
async def scenario(net: Net, tmp_path: Path) -> AsyncIterator[Scenario]:
    sc = await make_scenario(net, tmp_path, uuid.uuid4().hex[:6])
    try:
        yield sc
    finally:
        for name in list(sc.net.nodes):
            sc.net.heal(name)
        for w in sc.workers.values():
            if w.alive():
                w.kill()
        await asyncio.to_thread(sc.cluster.stop)
