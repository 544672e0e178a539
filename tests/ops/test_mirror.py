"""The MirrorMaker 2 configuration streamsched writes: what a failover relies on is always there
(names unchanged, committed records only, groups translated, streamsched's own topics mirrored),
exact topic names, credentials handed over in Java's form, and settings that would undo it refused."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from streamsched.errors import BrokerError, ConfigError
from streamsched.kafka.clients import Connection
from streamsched.ops.mirror import (
    POLICY_CLASS,
    MirrorMaker,
    MirrorPlan,
    checkpoints_topic,
    exact_patterns,
    java_client_properties,
    render_properties,
)

A = Connection("a:9092")
B = Connection("b:9092")


def java_properties(text: str) -> dict[str, str]:
    """A minimal reader of what :func:`render_properties` writes, as java.util.Properties reads
    it: ``\\\\`` is a backslash, ``\\n`` a line break, ``\\=`` ``=`` (enough for these files)."""
    out = {}
    for line in io.StringIO(text):
        line = line.rstrip("\n")
        key_chars, i = [], 0
        while not (line[i] == " " and line[i:i + 3] == " = "):
            if line[i] == "\\":
                i += 1
            key_chars.append(line[i])
            i += 1
        raw, value, j = line[i + 3:], [], 0
        while j < len(raw):
            if raw[j] == "\\" and raw[j + 1] == "u":
                value.append(chr(int(raw[j + 2:j + 6], 16)))  # one UTF-16 code unit
                j += 6
                continue
            if raw[j] == "\\":
                j += 1
                value.append({"n": "\n", "r": "\r"}.get(raw[j], raw[j]))
            else:
                value.append(raw[j])
            j += 1
        out["".join(key_chars)] = "".join(value).encode("utf-16", "surrogatepass").decode("utf-16")
    return out


def test_the_settings_a_failover_relies_on() -> None:
    plan = MirrorPlan(A, B, ("runs.transitions", "__streamsched.state.due_runs"), ("streamsched.due_runs",),
                      replication=1)
    props = plan.properties()
    assert props["primary->secondary.enabled"] == "true"
    assert props["secondary->primary.enabled"] == "false"
    assert props["secondary->primary.emit.heartbeats.enabled"] == "false"
    assert props["replication.policy.class"] == POLICY_CLASS
    assert props["primary.consumer.isolation.level"] == "read_committed"
    assert props["sync.group.offsets.enabled"] == "true"
    assert props["offset-syncs.topic.location"] == "target"
    assert props["topics.exclude"] == ""  # the stock filter drops every __* topic
    assert props["primary.bootstrap.servers"] == "a:9092" and props["secondary.bootstrap.servers"] == "b:9092"
    assert all(v == "1" for k, v in props.items() if k.endswith("replication.factor"))
    assert plan.checkpoints_topic == checkpoints_topic("primary") == "primary.checkpoints.internal"


def test_topic_and_group_lists_match_exact_names_only() -> None:
    import re

    listed = exact_patterns(["runs.transitions", "__streamsched.state.due_runs"])
    patterns = [re.compile(p.strip()) for p in listed.split(",")]
    assert any(p.fullmatch("runs.transitions") for p in patterns)
    assert not any(p.fullmatch("runsXtransitions") for p in patterns)  # the dot is not "any character"
    assert not any(p.fullmatch("runs.transitions.other") for p in patterns)


def test_rendered_file_reads_back_as_written() -> None:
    plan = MirrorPlan(A, B, ("a.b",), ("g",), options={"primary.consumer.client.rack": "x=y"})
    props = plan.properties()
    assert java_properties(render_properties(props)) == props
    # Java reads the file as ISO-8859-1: a credential past ASCII travels as \u escapes.
    odd = {"secondary.sasl.jaas.config": "p\u00e4ss\U0001f600\tw"}
    text = render_properties(odd)
    assert text.isascii() and java_properties(text) == odd
    # The topic list's escapes survive Java's reading (a single backslash would be dropped).
    assert "\\\\." in render_properties(props)


def test_sasl_is_handed_over_in_javas_form() -> None:
    props = java_client_properties(Connection("a:9093", security_protocol="SASL_PLAINTEXT",
                                              sasl_mechanism="SCRAM-SHA-512", sasl_username="mirror",
                                              sasl_password='p"w'))
    assert props["security.protocol"] == "SASL_PLAINTEXT"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                         'username="mirror" password="p\\"w";')


def test_a_token_provider_cannot_be_handed_to_java() -> None:
    conn = Connection("a:9093", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                      oauth_token_provider=lambda: "token")
    with pytest.raises(ConfigError, match="OAUTHBEARER"):
        java_client_properties(conn)


@pytest.mark.parametrize("key", ["primary.consumer.isolation.level", "replication.policy.class",
                                 "primary->secondary.topics", "secondary.bootstrap.servers", "topics.exclude",
                                 "primary.security.protocol", "secondary.ssl.truststore.location",
                                 "primary->secondary.consumer.isolation.level", "groups.exclude",
                                 "primary->secondary.replication.policy.class", "topic.filter.class",
                                 "group.filter.class", "offset-syncs.topic.location",
                                 "emit.checkpoints.enabled", "sync.group.offsets.enabled",
                                 "primary->secondary.enabled", "clusters",
                                 "primary->secondary.sync.group.offsets.enabled", "topics.blacklist"])
def test_settings_that_undo_the_plan_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace(">", ">")):
        MirrorPlan(A, B, ("t",), options={key: "x"}).properties()


@pytest.mark.parametrize("alias", ["", "1a", "a-b", "x" * 40])
def test_bad_aliases_are_refused(alias: str) -> None:
    with pytest.raises(ConfigError, match="alias"):
        MirrorPlan(A, B, ("t",), source_alias=alias)


def test_other_settings_pass_through() -> None:
    tuning = {"primary.consumer.fetch.max.wait.ms": "1500", "tasks.max": "8",
              "refresh.topics.interval.seconds": "30", "emit.checkpoints.interval.seconds": "5",
              "primary->secondary.sync.group.offsets.interval.seconds": "5"}
    props = MirrorPlan(A, B, ("t",), options=tuning).properties()
    assert all(props[k] == v for k, v in tuning.items())


@pytest.mark.parametrize("topic", ["orders.internal", "orders-internal", ".hidden", "__other"])
def test_a_topic_mirrormaker_takes_for_its_own_is_refused(topic: str) -> None:
    with pytest.raises(ConfigError, match="cannot be mirrored"):
        MirrorPlan(A, B, ("t", topic))
    MirrorPlan(A, B, ("__streamsched.state.x",))  # streamsched's own are mirrored


def test_one_mirror_per_workdir(tmp_path: Path) -> None:
    plan = MirrorPlan(A, B, ("t",))
    first = MirrorMaker(plan, tmp_path)
    first.claim_workdir()
    with pytest.raises(BrokerError, match="running already"):
        MirrorMaker(plan, tmp_path).claim_workdir()
    first.stop()  # never started: releases the workdir
    (tmp_path / "mirror.pid").write_text(f"{os.getpid()}\n")  # a MirrorMaker whose parent died
    with pytest.raises(BrokerError, match=f"pid {os.getpid()}"):
        MirrorMaker(plan, tmp_path).claim_workdir()
    (tmp_path / "mirror.pid").write_text("garbage\n")
    MirrorMaker(plan, tmp_path).claim_workdir()


def test_nothing_to_mirror_is_refused() -> None:
    with pytest.raises(ConfigError, match="nothing to mirror"):
        MirrorPlan(A, B, ())
