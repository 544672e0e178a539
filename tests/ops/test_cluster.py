"""The project's own three-node KRaft cluster, and a broker failure under a running worker."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import LocalCluster
from streamsched.testing import make_event, produce_events, running_worker, wait_drained

pytestmark = pytest.mark.kafka


async def test_three_nodes_survive_a_killed_broker(tmp_path: Path) -> None:
    cluster = LocalCluster(data_dir=tmp_path / "c3", nodes=3)
    bootstrap = await asyncio.to_thread(cluster.start)
    try:
        topic = "three.transitions"
        await apply(bootstrap, [TopicSpec(topic, 3, replication=3)])
        app = App("t")
        done: set[str] = set()

        @external_command()
        async def work(ctx: CommandContext, *, target: str) -> None:
            done.add(target)

        @app.scheduler(name="three", topic=topic, selection=Selection("due", type="due"), commands=[work],
                       claim_duration_s=5)
        async def handle(turn: Turn) -> None:
            await turn.commands.work(target=turn.event.target[0])

        sched = app.schedulers["three"]
        await produce_events(bootstrap, topic, [make_event("due", "t", [f"a{i}"]) for i in range(30)])
        async with running_worker(sched, bootstrap, replication=3):
            await wait_drained(bootstrap, sched.group, topic, timeout=90)
            cluster.kill_node(2, signal.SIGKILL)  # min.insync.replicas=2 of 3: still writable
            await produce_events(bootstrap, topic, [make_event("due", "t", [f"b{i}"]) for i in range(30)])
            await wait_drained(bootstrap, sched.group, topic, timeout=120)
        assert done == {f"a{i}" for i in range(30)} | {f"b{i}" for i in range(30)}
    finally:
        await asyncio.to_thread(cluster.stop)
