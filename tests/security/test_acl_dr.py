"""The disaster-recovery roles (``acl plan --role mirror-source|mirror-target|failover``), proven on
two secured clusters: MirrorMaker 2 (``streamsched dr mirror``, reading the primary over SASL_SSL)
running as a principal holding
exactly the mirror-source ACLs on the primary and the mirror-target ACLs on the secondary copies
the records (the state topic included) and translates the group's offsets, with no authorization
error in its log; ``dr failover`` as a principal holding exactly the failover ACLs commits them;
a principal without ACLs is refused by the broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streamsched.kafka import clients
from streamsched.kafka.reads import read_topic
from streamsched.ops.broker import LocalCluster, stop_pid_file
from streamsched.ops.broker_security import BrokerSecurity
from streamsched.testing import ROOT, make_event, produce_events, wait_for
from tests.security.role_support import cli, load_reference

PARTITIONS = 2
APP = "consumers.due_runs:app"


def tls_client_file(cluster: LocalCluster, user: str, where: Path) -> Path:
    """A connection file of ``user`` to ``cluster``'s SASL_SSL listener (its CA verified): the
    mirror reads the primary over TLS, so the PEM trust store reaches MirrorMaker's Java clients."""
    assert cluster.security is not None
    secret = where / f"{user}.password"
    secret.write_text(cluster.security.password(user).reveal())
    path = where / f"{user}-tls.toml"
    path.write_text(f'bootstrap = "{cluster.tls_bootstrap}"\nsecurity_protocol = "SASL_SSL"\n\n'
                    f'[sasl]\nmechanism = "SCRAM-SHA-512"\nusername = "{user}"\n'
                    f'password_file = "{secret}"\n\n'
                    f'[ssl]\ncafile = "{cluster.security.ca_file}"\n')
    return path


async def test_mirror_and_failover_roles_suffice_on_secured_clusters(secure: LocalCluster,
                                                                      tmp_path: Path) -> None:
    assert secure.security is not None
    env = {"STREAMSCHED_NAMESPACE": f".dr{uuid.uuid4().hex[:6]}"}
    sched = next(iter(load_reference("due_runs", env).app.schedulers.values()))
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "t.toml").write_text(
        f'[[topic]]\nname = "{sched.topic}"\npartitions = {PARTITIONS}\nkind = "transition"\n')
    scope = ["--dir", str(tmp_path / "topics"), "--app", APP]
    b_security = BrokerSecurity.create(tmp_path / "b-security", ("mirror", "dr_operator", "intruder"))
    b = LocalCluster(tmp_path / "b", security=b_security, heap="-Xmx384m")
    await asyncio.to_thread(b.start)
    mirror: subprocess.Popen[bytes] | None = None
    try:
        a_files = {"admin": secure.security.write_client_file(secure.bootstrap, "admin"),
                   "mirror": tls_client_file(secure, "mirror", tmp_path)}
        b_files = {u: b_security.write_client_file(b.bootstrap, u)
                   for u in ("admin", "mirror", "dr_operator", "intruder")}

        def ok(*args: str) -> str:
            proc = cli(list(args), env)
            assert proc.returncode == 0, f"{args[:3]}: {proc.stderr}"
            return proc.stdout

        ok("topics", "apply", "--config", str(a_files["admin"]), "--replication", "1", *scope)
        ok("topics", "apply", "--config", str(b_files["admin"]), "--source-config", str(a_files["admin"]),
           "--replication", "1", *scope)
        ok("acl", "apply", "--config", str(a_files["admin"]), "--role", "mirror-source", "--app", APP,
           "--principal", "User:mirror")
        ok("acl", "apply", "--config", str(b_files["admin"]), "--role", "mirror-target", "--app", APP,
           "--principal", "User:mirror")
        ok("acl", "apply", "--config", str(b_files["admin"]), "--role", "failover", "--app", APP,
           "--principal", "User:dr_operator")

        # The primary's history: events, a state record, and the group's committed offsets.
        admin_a = secure.connection()
        await produce_events(admin_a, sched.topic, [make_event("due", "t", [f"r{i}"]) for i in range(20)])
        producer = clients.producer(admin_a)
        await producer.start()
        try:
            await producer.send_and_wait(sched.state_topic, b"state", key=b"sched_x", partition=0)
        finally:
            await producer.stop()
        tps = [TopicPartition(sched.topic, p) for p in range(PARTITIONS)]
        committer = clients.consumer(admin_a, group_id=sched.group)
        await committer.start()
        try:
            committer.assign(tps)
            ends = await committer.end_offsets(tps)
            await committer.commit({tp: OffsetAndMetadata(int(ends[tp]), "") for tp in tps})
        finally:
            await committer.stop()

        work = tmp_path / "mirror"
        with open(tmp_path / "dr-mirror.log", "ab") as out:
            mirror = subprocess.Popen(
                [sys.executable, "-m", "streamsched", "dr", "mirror", "--config", str(b_files["mirror"]),
                 "--source-config", str(a_files["mirror"]), "--replication", "1", "--workdir", str(work),
                 *scope], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        admin_b = b.connection()

        async def mirrored() -> bool:
            state = await read_topic(admin_b, sched.state_topic)
            events = await read_topic(admin_b, sched.topic)
            return len(state) == 1 and len(events) == 20

        async def translated() -> bool:
            reader = clients.consumer(admin_b, group_id=sched.group)
            await reader.start()
            try:
                reader.assign(tps)
                return all([await reader.committed(tp) is not None for tp in tps])
            finally:
                await reader.stop()

        await wait_for(mirrored, timeout=120, interval=1.0, what="the records mirrored as User:mirror")
        await wait_for(translated, timeout=120, interval=1.0, what="the group's offsets translated")
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(60) == 0
        log = (work / "server.log").read_text()
        denied = [ln for ln in log.splitlines() if "AuthorizationException" in ln]
        assert not denied, denied[:3]

        moved = ok("dr", "failover", "--config", str(b_files["dr_operator"]), "--json", *scope)
        assert {m["topic"] for m in json.loads(moved)["moves"]} == {sched.topic}
        refused = cli(["dr", "failover", "--config", str(b_files["intruder"]), *scope], env)
        assert refused.returncode != 0
        assert "Authorization" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    finally:
        if mirror is not None and mirror.poll() is None:
            mirror.kill()
        stop_pid_file(tmp_path / "mirror" / "mirror.pid", timeout=5)
        await asyncio.to_thread(b.stop)


def test_the_plans_name_exactly_the_mirrored_topics_and_groups() -> None:
    from streamsched.ops.acl_dr import mirrored, plan_failover, plan_mirror_source

    env = {"STREAMSCHED_NAMESPACE": ".plan"}
    app = load_reference("due_runs", env).app
    topics, groups = mirrored(app, None, ["nightly"])
    assert "runs.transitions.plan" in topics and "__streamsched.state.due_runs.plan" in topics
    assert "__streamsched.schedules.nightly.definitions" in topics
    assert groups == ["streamsched.due_runs.plan", "streamsched.schedules.nightly"]
    source = {(a.resource_type, a.resource_name, a.operation)
              for a in plan_mirror_source(topics, groups, "m")}
    assert not {op for _, _, op in source} & {"WRITE", "CREATE", "ALTER_CONFIGS"}  # read only
    failover = plan_failover(topics, groups, "User:op", source_alias="east")
    named = {a.resource_name for a in failover if a.resource_type == "TOPIC"}
    assert named == {*topics, "east.checkpoints.internal"}
    with pytest.raises(Exception, match="alias"):
        plan_failover(topics, groups, "User:op", source_alias="no-dash")
