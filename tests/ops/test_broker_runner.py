"""The local broker runner makes cluster ids as Kafka does, so `broker start` never fails on one,
and runs the Kafka release it is asked for (jars, logging and data dir per release)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamsched.errors import BrokerError
from streamsched.ops import broker
from streamsched.ops.broker import _cluster_id

_ALPHABET = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_cluster_ids_never_start_with_a_dash() -> None:
    # About 1 in 64 random UUIDs encode with a leading '-', which kafka-storage reads as an
    # option; 20,000 draws would hit ~300 of them without the redraw.
    ids = [_cluster_id() for _ in range(20_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert len(text) == 22 and set(text) <= _ALPHABET
        raw = base64.urlsafe_b64decode(text + "==")
        assert len(raw) == 16
        assert raw[6] >> 4 == 4 and raw[8] & 0xC0 == 0x80  # version 4, RFC 4122 variant
        assert raw not in (bytes(16), bytes(15) + b"\x01")
    # Dashes elsewhere are valid base64url and must stay possible (no skewed alphabet).
    assert any("-" in i for i in ids)


def test_a_leading_dash_or_reserved_id_is_drawn_again() -> None:
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url '-' is 62: top six bits 111110
    zero = uuid.UUID(int=0)
    good = uuid.UUID("12345678-1234-4234-8234-123456789abc")
    assert base64.urlsafe_b64encode(dash.bytes).startswith(b"-")
    draws: Iterator[uuid.UUID] = iter([dash, zero, good])
    drawn: list[uuid.UUID] = []

    def fake() -> uuid.UUID:
        drawn.append(next(draws))
        return drawn[-1]

    assert _cluster_id(fake) == base64.urlsafe_b64encode(good.bytes).decode().rstrip("=")
    assert drawn == [dash, zero, good]


# --- Kafka version selection (issue 8.5) -------------------------------------------------------------

def test_the_version_comes_from_the_argument_then_the_variable_then_the_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMSCHED_KAFKA_VERSION", raising=False)
    assert broker.kafka_version() == broker.KAFKA_VERSION == broker.TESTED_KAFKA_VERSIONS[-1]
    monkeypatch.setenv("STREAMSCHED_KAFKA_VERSION", "3.9.1")
    assert broker.kafka_version() == "3.9.1"
    assert broker.kafka_version("4.4.0") == "4.4.0"
    with pytest.raises(BrokerError, match="not a Kafka version"):
        broker.kafka_version("latest")
    monkeypatch.setenv("STREAMSCHED_CACHE", str(tmp_path))
    assert broker.cache_dir("4.4.0") == tmp_path / "kafka-4.4.0"  # jars cached per version
    assert broker.cache_dir() == tmp_path / "kafka-3.9.1"


def test_kafka_4_gets_log4j2_and_3_9_keeps_reload4j() -> None:
    pom4 = broker.pom_for("4.4.0")
    assert "<version>4.4.0</version>" in pom4 and "log4j-slf4j-impl" in pom4 and "reload4j" not in pom4
    pom3 = broker.pom_for("3.9.1")
    assert "slf4j-reload4j" in pom3 and "log4j-slf4j-impl" not in pom3
    name, text, option = broker.logging_config("4.4.0")
    assert name == "log4j2.properties" and option.startswith("-Dlog4j2.configurationFile=")
    assert "${sys:kafka.logs.dir}/server.log" in text
    name, text, option = broker.logging_config("3.9.1")
    assert name == "log4j.properties" and option.startswith("-Dlog4j.configuration=")


# What `mvn -B -q dependency:copy-dependencies` prints for a release Maven Central does not have.
_MVN_NOT_FOUND = """\x1b[0m[ERROR] Failed to execute goal on project kafka-runtime: Could not resolve \
dependencies for project dev.streamsched:kafka-runtime:pom:1: The following artifacts could not be \
resolved: org.apache.kafka:kafka_2.13:jar:9.9.9, org.apache.kafka:kafka-tools:jar:9.9.9: Could not find \
artifact org.apache.kafka:kafka_2.13:jar:9.9.9 in central (https://repo.maven.apache.org/maven2) -> [Help 1]
[ERROR]
[ERROR] To see the full stack trace of the errors, re-run Maven with the -e switch.
[ERROR] Re-run Maven using the -X switch to enable full debug logging.
[ERROR]
[ERROR] For more information about the errors and possible solutions, please read the following articles:
[ERROR] [Help 1] http://cwiki.apache.org/confluence/display/MAVEN/DependencyResolutionException
\x1b[0m\x1b[0m"""


def test_a_release_maven_cannot_find_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from streamsched.ops import cli

    # A stand-in mvn (the real one takes half a minute and the network to say the same).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "mvn.out").write_text(_MVN_NOT_FOUND)
    (bin_dir / "mvn").write_text(f"#!/bin/sh\ncat {tmp_path / 'mvn.out'}\nexit 1\n")
    (bin_dir / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STREAMSCHED_CACHE", str(tmp_path / "cache"))
    code = cli.main(["broker", "start", "--kafka-version", "9.9.9", "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    log = tmp_path / "cache" / "kafka-9.9.9" / "mvn.log"
    assert code == 2 and err == (
        "streamsched: BrokerError: mvn could not resolve Kafka 9.9.9's jars: Could not find artifact "
        "org.apache.kafka:kafka_2.13:jar:9.9.9 in central (https://repo.maven.apache.org/maven2) "
        f"(Maven's output: {log})\n"), err
    assert log.read_text() == _MVN_NOT_FOUND  # all of it, for whoever needs more than the reason


def test_a_data_dir_keeps_the_release_it_was_formatted_with(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({
        "cluster_id": "x", "kafka_version": "3.9.1", "bootstrap": "127.0.0.1:1",
        "nodes": [{"node_id": 1, "port": 1, "controller_port": 2, "data_dir": str(tmp_path / "n")}]}))
    kept = broker.LocalCluster(data_dir=tmp_path)
    kept._plan()
    assert kept.version == "3.9.1"
    with pytest.raises(BrokerError, match=r"holds a Kafka 3\.9\.1 cluster"):
        broker.LocalCluster(data_dir=tmp_path, kafka_version="4.4.0")._plan()


def test_nodes_bind_and_advertise_their_own_hosts_and_launch_behind_a_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fault scenarios (tests/faults) run each node in its own network namespace.
    hosts = ["10.231.0.11", "10.231.0.12"]
    cluster = broker.LocalCluster(data_dir=tmp_path, nodes=2, hosts=hosts,
                                  launch_prefix=lambda spec: ["ip", "netns", "exec", f"ns{spec.node_id}"])
    cluster._plan()
    assert cluster.bootstrap == ",".join(f"{h}:{s.port}" for h, s in zip(hosts, cluster.specs, strict=True))
    props = dict(line.split("=", 1) for line in cluster._properties(cluster.specs[1]).splitlines())
    b, c = cluster.specs
    assert props["listeners"] == f"PLAINTEXT://10.231.0.12:{c.port},CONTROLLER://10.231.0.12:{c.controller_port}"
    assert props["advertised.listeners"] == f"PLAINTEXT://10.231.0.12:{c.port}"
    assert props["controller.quorum.voters"] == (f"1@10.231.0.11:{b.controller_port},"
                                                 f"2@10.231.0.12:{c.controller_port}")
    launched: list[list[str]] = []
    monkeypatch.setattr(broker.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd))
    c.data_dir.mkdir(parents=True)
    cluster._launch(c, tmp_path)
    assert launched[0][:4] == ["ip", "netns", "exec", "ns2"] and launched[0][-2] == "kafka.Kafka"
    cluster._save("x")  # a restart finds the hosts again
    again = broker.LocalCluster(data_dir=tmp_path)
    again._plan()
    assert again.bootstrap == cluster.bootstrap
    with pytest.raises(BrokerError, match="one address per node"):
        broker.LocalCluster(data_dir=tmp_path / "other", nodes=3, hosts=hosts)._plan()


def test_a_node_already_dead_leaves_the_quorum_so_the_last_one_running_stops_quickly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    dirs = []
    for name, pid in (("node-1", os.getpid()), ("node-2", os.getpid()), ("node-3", gone.pid)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pid").write_text(f"{pid}\n")
        dirs.append(tmp_path / name)
    given: list[tuple[str, float]] = []
    monkeypatch.setattr(broker, "stop_pid_file", lambda f, *, timeout: given.append((f.parent.name, timeout)))
    broker.stop_nodes(dirs, timeout=30.0)
    # node-1 stops with node-2 as its quorum; node-2 then runs alone (node-3 was dead all along).
    alone = broker.NO_QUORUM_STOP_S
    assert given == [("node-1", 30.0), ("node-2", alone), ("node-3", alone)]


def test_a_stopped_node_is_continued_so_it_shuts_down_on_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    # A stand-in for a broker JVM: it exits 0 on SIGTERM (a controlled shutdown).
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                             "print('up', flush=True)\ntime.sleep(120)"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        proc.send_signal(signal.SIGSTOP)  # as a fault leaves it
        pid_file = tmp_path / "pid"
        pid_file.write_text(str(proc.pid))
        assert broker.stop_pid_file(pid_file, timeout=60) is True
        # Exited on SIGTERM, not killed past the timeout: it was continued.
        assert proc.wait(timeout=10) == 0 and not pid_file.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
