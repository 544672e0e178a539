"""The project's own three-node KRaft cluster, and a broker failure under a running worker."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import LocalCluster
from streamsched.testing import make_event, produce_events, running_worker, wait_drained

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
async def cluster3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(data_dir=tmp_path_factory.mktemp("c3"), nodes=3) as cluster:
        yield cluster


async def test_fresh_applies_on_three_nodes_never_report_false_drift(cluster3: LocalCluster) -> None:
    # Defect 4f: metadata and configs are answered by different brokers, which learn of a new
    # topic at different moments (measured: 6 of 24 fresh applies reported
    # "cleanup.policy is 'None'"). Every fresh apply must succeed.
    for i in range(12):
        tag = uuid.uuid4().hex[:8]
        specs = [TopicSpec(f"fresh-{tag}.t", 3, replication=3),
                 TopicSpec(f"fresh-{tag}.s", 3, replication=3, kind="state"),
                 TopicSpec(f"fresh-{tag}.d", 3, replication=3, kind="delay")]
        report = await apply(cluster3.bootstrap, specs)
        assert sorted(report.created) == sorted(s.name for s in specs), i


async def test_three_nodes_survive_a_killed_broker(cluster3: LocalCluster) -> None:
    bootstrap = cluster3.bootstrap
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
        cluster3.kill_node(2, signal.SIGKILL)  # min.insync.replicas=2 of 3: still writable
        await produce_events(bootstrap, topic, [make_event("due", "t", [f"b{i}"]) for i in range(30)])
        await wait_drained(bootstrap, sched.group, topic, timeout=120)
    assert done == {f"a{i}" for i in range(30)} | {f"b{i}" for i in range(30)}
