"""Durable topic defaults (issue 8 item 4), checked on real clusters: internal topics get
replication min(3, brokers) and min.insync.replicas min(2, replication); nothing creates an RF 1
internal topic on a multi-broker cluster unless told; replication/min.insync drift is refused by
default and reported when accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError, TopicMismatch
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply, load_file
from streamsched.ops.broker import LocalCluster
from streamsched.ops.cli import main
from streamsched.schedules.catalog import Catalog
from streamsched.testing import running_worker, wait_for

Unique = Callable[[str], str]


async def describe(bootstrap: str, topic: str) -> tuple[int, str]:
    """(replication factor of every partition, min.insync.replicas) as the cluster shows them."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        rfs: set[int] = set()
        entries: dict[str, str] = {}

        async def visible() -> bool:
            # Each broker learns of a new topic on its own schedule: ask until one knows it.
            nonlocal rfs, entries
            metas = [d for d in await admin.describe_topics([topic]) if d["topic"] == topic]
            rfs = {len(p["replicas"]) for d in metas for p in d["partitions"]}
            responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            entries = {e[0]: e[1] for r in responses for res in r.resources if res[0] == 0 for e in res[4]}
            return bool(rfs) and "min.insync.replicas" in entries

        await wait_for(visible, timeout=30, interval=0.2, what=f"topic {topic} to be visible")
        assert len(rfs) == 1, rfs
        return rfs.pop(), entries["min.insync.replicas"]
    finally:
        await admin.close()


async def topics(bootstrap: str) -> set[str]:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


# --- the rules, without a broker ------------------------------------------------------------------

@pytest.mark.parametrize(("brokers", "rf", "isr"), [(1, 1, "1"), (2, 2, "2"), (3, 3, "2"), (5, 3, "2")])
def test_internal_defaults_follow_the_cluster(brokers: int, rf: int, isr: str) -> None:
    for kind in ("state", "dead_letter", "delay"):
        spec = TopicSpec("__streamsched.x", 2, kind=kind).resolved(brokers)  # type: ignore[arg-type]
        assert (spec.replication, spec.config["min.insync.replicas"]) == (rf, isr)
    feedback = TopicSpec("__streamsched.schedules.c.feedback", 2, kind="output").resolved(brokers)
    assert feedback.internal and feedback.config["min.insync.replicas"] == isr  # a catalog's topic
    user = TopicSpec("orders", 2).resolved(brokers)
    assert user.replication == rf and "min.insync.replicas" not in user.config and not user.internal


def test_explicit_settings_win() -> None:
    spec = TopicSpec("s", 1, 2, kind="state", config={"min.insync.replicas": "1"}).resolved(5)
    assert (spec.replication, spec.config["min.insync.replicas"]) == (2, "1")
    assert TopicSpec("s", 1, 1, kind="state").resolved(3).config["min.insync.replicas"] == "1"


def test_a_definition_without_replication_takes_the_default(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[topic]]\nname = "a"\npartitions = 2\n\n[[topic]]\nname = "b"\npartitions = 2\n'
                    'replication = 2\n')
    assert [s.replication for s in load_file(path)] == [None, 2]


# --- one broker -----------------------------------------------------------------------------------

async def test_single_broker_internal_topics_get_rf1_and_min_insync_1(bootstrap: str, unique: Unique) -> None:
    state, user = unique("st"), unique("u")
    report = await apply(bootstrap, [TopicSpec(state, 2, kind="state"), TopicSpec(user, 2)])
    assert report.brokers == 1 and report.replication == {state: 1, user: 1}
    assert await describe(bootstrap, state) == (1, "1")


async def test_min_insync_drift_is_refused_unless_accepted(bootstrap: str, unique: Unique) -> None:
    name = unique("isr")
    await apply(bootstrap, [TopicSpec(name, 1, kind="state")])
    stricter = TopicSpec(name, 1, kind="state", config={"min.insync.replicas": "2"})
    with pytest.raises(TopicMismatch) as err:
        await apply(bootstrap, [stricter])
    assert (err.value.field, err.value.expected, err.value.actual) == ("min.insync.replicas", "2", "1")
    report = await apply(bootstrap, [stricter], allow_drift=True)
    assert [(d.topic, d.field) for d in report.drift] == [(name, "min.insync.replicas")]
    # Other differences are never accepted.
    with pytest.raises(TopicMismatch):
        await apply(bootstrap, [TopicSpec(name, 3, kind="state")], allow_drift=True)


def test_topics_apply_refuses_drift_in_one_line_and_reports_it_when_allowed(
        bootstrap: str, unique: Unique, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = unique("cli")
    (tmp_path / "a.toml").write_text(f'[[topic]]\nname = "{name}"\npartitions = 1\nkind = "state"\n')
    assert main(["topics", "apply", "--dir", str(tmp_path), "--bootstrap", bootstrap]) == 0
    capsys.readouterr()
    (tmp_path / "a.toml").write_text(f'[[topic]]\nname = "{name}"\npartitions = 1\nkind = "state"\n'
                                     'config = { "min.insync.replicas" = "2" }\n')
    assert main(["topics", "apply", "--dir", str(tmp_path), "--bootstrap", bootstrap]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TopicMismatch" in err and "min.insync.replicas" in err
    assert main(["topics", "apply", "--dir", str(tmp_path), "--bootstrap", bootstrap, "--allow-drift"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["brokers"] == 1 and out["replication"] == {name: 1}
    assert out["drift"] == [{"topic": name, "field": "min.insync.replicas", "expected": "2", "actual": "1"}]


# --- two brokers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
async def cluster2(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(data_dir=tmp_path_factory.mktemp("rf2"), nodes=2) as cluster:
        yield cluster


@pytest.mark.kafka
async def test_multi_broker_defaults_and_refusals(cluster2: LocalCluster, unique: Unique) -> None:
    bs = cluster2.bootstrap
    state, delay, dlq, user = (f"__streamsched.{k}.{unique('x')}" for k in ("state", "delay", "dlq", "u"))
    report = await apply(bs, [TopicSpec(state, 2, kind="state"), TopicSpec(delay, 2, kind="delay"),
                              TopicSpec(dlq, 2, kind="dead_letter")])
    assert report.brokers == 2 and set(report.replication.values()) == {2}
    for name in (state, delay, dlq):
        assert await describe(bs, name) == (2, "2")

    # An RF 1 internal topic on two brokers: refused, nothing created; allowed with the flag.
    single = TopicSpec(user, 1, 1, kind="state")
    with pytest.raises(ConfigError, match="replication factor 1 on a 2-broker cluster"):
        await apply(bs, [single])
    assert user not in await topics(bs)
    await apply(bs, [single], allow_single_replica=True)
    assert (await describe(bs, user))[0] == 1

    # That topic now differs from the default definition (RF 2): refused, or reported.
    with pytest.raises(TopicMismatch) as err:
        await apply(bs, [TopicSpec(user, 1, kind="state")])
    assert (err.value.field, err.value.expected, err.value.actual) == ("replication", "2", "1")
    accepted = await apply(bs, [TopicSpec(user, 1, kind="state")], allow_drift=True)
    assert {(d.field, d.expected, d.actual) for d in accepted.drift} == {("replication", "2", "1"),
                                                                        ("min.insync.replicas", "2", "1")}


@pytest.mark.kafka
async def test_a_worker_and_a_catalog_create_durable_topics(cluster2: LocalCluster, unique: Unique) -> None:
    # Measured before: `streamsched run` made RF 1 state/DLQ/delay topics beside an RF 3 topic.
    bs = cluster2.bootstrap
    topic = unique("rt")
    await apply(bs, [TopicSpec(topic, 2)])
    app = App("rf")

    @external_command()
    async def noop(ctx: CommandContext) -> None:
        return None

    @app.scheduler(name=unique("rf").replace("-", "_"), topic=topic, selection=Selection("due", type="due"),
                   commands=[noop])
    async def handle(turn: Turn) -> None:
        await turn.commands.noop()

    (sched,) = app.schedulers.values()
    async with running_worker(sched, bs) as worker:
        await asyncio.wait_for(worker.assigned.wait(), 60)
    for name in (sched.state_topic, sched.dead_letter_topic, sched.delay_topic):
        assert await describe(bs, name) == (2, "2"), name

    catalog = Catalog(bs, unique("cat").replace("-", "_"), partitions=1)
    await catalog.ensure_topics()
    for spec in catalog.topic_specs():
        assert await describe(bs, spec.name) == (2, "2"), spec.name
    # The CLI's catalog: an explicit RF 1 is refused in one line, before anything is created.
    name = unique("c1").replace("-", "_")
    args: list[Any] = ["schedule", "add", "s", "@every 1m", "--target", topic, "--catalog", name,
                       "--replication", "1", "--bootstrap", bs]
    assert await asyncio.to_thread(main, args) == 2
    assert not {s.name for s in Catalog(bs, name).topic_specs()} & await topics(bs)
