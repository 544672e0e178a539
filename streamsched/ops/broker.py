"""Local Apache Kafka runner: fetch the broker jars with Maven, format KRaft storage, start nodes.

The project never depends on Docker: the broker is Apache Kafka's own jars from Maven Central,
resolved once by ``mvn`` from a pinned pom into a cache directory and run on the machine's Java.
A node is a combined broker+controller on loopback; :class:`LocalCluster` starts one or more.
Which release, its jars and its logging config: :mod:`streamsched.ops.broker_jars`; the
secured listeners, SCRAM users and test CA: :mod:`streamsched.ops.broker_security`.

Why one module just above ~400 lines: a node's properties, format, launch and stop share the
node directory layout and pid files; the parts that vary (jars, security) are already split out.
"""


from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamsched.errors import BrokerError
from streamsched.kafka import clients
from streamsched.ops.broker_jars import (
    DEFAULT_HEAP,
    KAFKA_VERSION,
    TESTED_KAFKA_VERSIONS,
    VERSION_ENV,
    cache_dir,
    ensure_jars,
    is_kafka4,
    java,
    kafka_version,
    logging_config,
    pom_for,
)
from streamsched.ops.broker_security import ADMIN, BrokerSecurity

__all__ = ["DEFAULT_HEAP", "KAFKA_VERSION", "TESTED_KAFKA_VERSIONS", "VERSION_ENV", "LocalCluster",
           "NodeSpec", "cache_dir", "ensure_jars", "free_port", "is_kafka4", "kafka_version",
           "logging_config", "pom_for", "status", "stop_nodes", "stop_pid_file", "wait_ready"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_RESERVED_IDS = frozenset({bytes(16), bytes(15) + b"\x01"})
"""Kafka's ``Uuid.ZERO_UUID`` and ``Uuid.ONE_UUID`` (the metadata topic's id)."""


def _cluster_id(random_uuid: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid()`` makes one (``kafka-storage random-uuid``).

    A version-4 UUID as unpadded base64url, drawn again while it is reserved or its text starts
    with ``-`` (about 1 in 64 do): the storage tool would read such an id as an option and the
    format, hence ``broker start``, would fail (defect 4l). Checked against Kafka 3.9.1's
    ``org.apache.kafka.common.Uuid.randomUuid``.
    """
    while True:
        raw = random_uuid().bytes
        text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        if raw not in _RESERVED_IDS and not text.startswith("-"):
            return text


@dataclass
class NodeSpec:
    node_id: int
    port: int
    controller_port: int
    data_dir: Path
    tls_port: int | None = None
    """SASL_SSL listener of a secured node with TLS (mTLS ``SSL`` is ``mtls_port``)."""
    mtls_port: int | None = None
    host: str = "127.0.0.1"
    """The address the node binds and advertises (its listeners and its controller)."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


NO_QUORUM_STOP_S = 3.0
"""How long a node without a controller quorum gets to stop before SIGKILL (see LocalCluster.stop)."""
MAX_NODES = 9
"""The most nodes a local cluster may have: each is a JVM with its own heap on one machine."""


@dataclass
class LocalCluster:
    """N combined broker+controller nodes on loopback, each a JVM child process.

    ``extra_config`` is merged into every node's server.properties. ``security`` runs the nodes
    secured (SASL, authorizer, optional TLS; see :mod:`streamsched.ops.broker_security`): then
    ``bootstrap`` is the SASL_PLAINTEXT listener and :meth:`connection` gives a user's connection.
    ``kafka_version`` picks the broker (default :func:`kafka_version`); a data dir keeps the
    version it was formatted with.

    ``hosts`` (one address per node, unsecured clusters only) binds and advertises node *i* on
    ``hosts[i]`` instead of loopback, and ``launch_prefix`` wraps each node's command (e.g.
    ``["ip", "netns", "exec", NAME]``): the fault scenarios (tests/faults) run each node in its
    own network namespace this way, so that one node can be cut off by nftables rules.
    """

    data_dir: Path
    nodes: int = 1
    port: int | None = None
    heap: str = DEFAULT_HEAP
    extra_config: dict[str, str] = field(default_factory=dict)
    security: BrokerSecurity | None = None
    kafka_version: str | None = None
    hosts: list[str] | None = None
    launch_prefix: Callable[[NodeSpec], list[str]] | None = None
    specs: list[NodeSpec] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Refused here, before start() creates the data directory: bad input leaves nothing behind.
        kafka_version(self.kafka_version)
        if not 1 <= self.nodes <= MAX_NODES:
            raise BrokerError(f"a local cluster has 1..{MAX_NODES} nodes, not {self.nodes}")
        if self.port is not None and not 1 <= self.port <= 65535 - self.nodes:
            raise BrokerError(f"--port must be in 1..{65535 - self.nodes}, not {self.port}")

    @property
    def bootstrap(self) -> str:
        return ",".join(s.bootstrap for s in self.specs)

    @property
    def version(self) -> str:
        """The Kafka version these nodes run (resolved by :meth:`start`)."""
        return kafka_version(self.kafka_version)

    def _plan(self) -> None:
        state = self.data_dir / "cluster.json"
        if state.exists():
            saved = json.loads(state.read_text())
            formatted = str(saved.get("kafka_version", "3.9.1"))
            if self.kafka_version is not None and kafka_version(self.kafka_version) != formatted:
                # Metadata written by one line is not portable to the other (4.x cannot start on
                # a 3.x log without an upgrade, 3.x not at all on 4.x): never mix them.
                raise BrokerError(f"{self.data_dir} holds a Kafka {formatted} cluster; "
                                  f"remove it to start Kafka {self.kafka_version}")
            self.kafka_version = formatted
            self.specs = [
                NodeSpec(n["node_id"], n["port"], n["controller_port"], Path(n["data_dir"]),
                         n.get("tls_port"), n.get("mtls_port"), n.get("host", "127.0.0.1"))
                for n in saved["nodes"]
            ]
            return
        self.specs = []
        if self.hosts is not None and (len(self.hosts) != self.nodes or self.security is not None):
            raise BrokerError("hosts: one address per node, and only for an unsecured cluster")
        for i in range(self.nodes):
            port = self.port + i if (self.port and i == 0) else free_port()
            if self.port and i > 0:
                port = self.port + i
            tls = self.security is not None and self.security.tls
            self.specs.append(NodeSpec(i + 1, port, free_port(), self.data_dir / f"node-{i + 1}",
                                       free_port() if tls else None, free_port() if tls else None,
                                       self.hosts[i] if self.hosts else "127.0.0.1"))

    @property
    def tls_bootstrap(self) -> str:
        """The SASL_SSL listeners (a secured cluster with TLS)."""
        return ",".join(f"127.0.0.1:{s.tls_port}" for s in self.specs if s.tls_port)

    @property
    def mtls_bootstrap(self) -> str:
        """The SSL listeners that require a client certificate (a secured cluster with TLS)."""
        return ",".join(f"127.0.0.1:{s.mtls_port}" for s in self.specs if s.mtls_port)

    def connection(self, user: str = ADMIN, *, mechanism: str = "SCRAM-SHA-512", tls: bool = False,
                   options: dict[str, object] | None = None) -> clients.Connection:
        """How ``user`` connects (a plain connection when the cluster is not secured)."""
        if self.security is None:
            return clients.Connection(self.bootstrap, dict(options or {}))
        return self.security.connection(self.tls_bootstrap if tls else self.bootstrap, user,
                                        mechanism=mechanism, tls=tls, options=dict(options or {}))

    def _properties(self, spec: NodeSpec) -> str:
        voters = ",".join(f"{s.node_id}@{s.host}:{s.controller_port}" for s in self.specs)
        rf = min(3, len(self.specs))
        scheme = "PLAINTEXT"  # the secured listeners are added by BrokerSecurity
        props = {
            "process.roles": "broker,controller",
            "node.id": str(spec.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{scheme}://{spec.host}:{spec.port},CONTROLLER://{spec.host}:{spec.controller_port}",
            "advertised.listeners": f"{scheme}://{spec.host}:{spec.port}",
            "inter.broker.listener.name": scheme,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{scheme}:{scheme}",
            "log.dirs": str(spec.data_dir / "log"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(min(2, rf)),
            "transaction.state.log.num.partitions": "8",
            "default.replication.factor": str(rf),
            "min.insync.replicas": str(min(2, rf)),
            "group.initial.rebalance.delay.ms": "0",
            # Tests use short sessions so a killed or paused worker is evicted quickly.
            "group.min.session.timeout.ms": "1000",
            "log.cleaner.enable": "true",
            "log.cleaner.backoff.ms": "2000",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "log.retention.check.interval.ms": "60000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "5000",
            "transaction.remove.expired.transaction.cleanup.interval.ms": "60000",
            "socket.request.max.bytes": str(64 * 1024 * 1024),
            "unclean.leader.election.enable": "false",
        }
        if self.security is not None:
            listeners, advertised = self.security.listeners(spec.port, spec.controller_port, spec.tls_port,
                                                            spec.mtls_port)
            props.update(listeners=listeners, **{"advertised.listeners": advertised})
            props.update(self.security.properties())
        props.update(self.extra_config)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _format(self, spec: NodeSpec, lib: Path, cluster_id: str) -> None:
        spec.data_dir.mkdir(parents=True, exist_ok=True)
        conf = spec.data_dir / "server.properties"
        conf.touch(mode=0o600)  # created private: a secured node's properties hold JAAS passwords
        conf.write_text(self._properties(spec))
        name, text, _ = logging_config(self.version)
        (spec.data_dir / name).write_text(text)
        if (spec.data_dir / "log" / "meta.properties").exists():
            return
        cmd = [java(), "-Xmx256m", "-cp", f"{lib}/*", "kafka.tools.StorageTool",
               "format", "-t", cluster_id, "-c", str(conf), "--ignore-formatted"]
        if self.security is not None:
            cmd += self.security.format_args()  # SCRAM users exist before the first start
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self._env(spec))
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr)[-1500:]
            for pw in (self.security.users.values() if self.security else ()):
                out = out.replace(pw.reveal(), "***")  # the tool may echo an --add-scram argument
            raise BrokerError(f"kafka storage format failed: {out}")

    def _env(self, spec: NodeSpec) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KAFKA_OPTS", None)
        return env

    def _launch(self, spec: NodeSpec, lib: Path) -> subprocess.Popen[bytes]:
        cmd = [java(), self.heap, "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-Djava.awt.headless=true",
               f"-Dkafka.logs.dir={spec.data_dir}"]
        name, _, option = logging_config(self.version)
        cmd.append(option.format(path=spec.data_dir / name))
        cmd += ["-cp", f"{lib}/*", "kafka.Kafka", str(spec.data_dir / "server.properties")]
        if self.launch_prefix is not None:
            cmd = [*self.launch_prefix(spec), *cmd]
        out = open(spec.data_dir / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=self._env(spec))
        finally:
            out.close()

    def start(self, *, timeout: float = 90.0) -> str:
        """Start every node (formatting storage on first use) and wait until metadata answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._plan()
        lib = ensure_jars(self.version)
        state = self.data_dir / "cluster.json"
        cluster_id = json.loads(state.read_text())["cluster_id"] if state.exists() else _cluster_id()
        for spec in self.specs:
            self._format(spec, lib, cluster_id)
        for spec in self.specs:
            self.start_node(spec.node_id, lib=lib)
        self._save(cluster_id)
        wait_ready(self.connection(), timeout=timeout, expect_brokers=len(self.specs),
                   procs=list(self.procs.values()))
        return self.bootstrap

    def start_node(self, node_id: int, *, lib: Path | None = None) -> None:
        spec = self._spec(node_id)
        proc = self._launch(spec, lib or ensure_jars(self.version))
        self.procs[node_id] = proc
        (spec.data_dir / "pid").write_text(f"{proc.pid}\n")

    def _spec(self, node_id: int) -> NodeSpec:
        for spec in self.specs:
            if spec.node_id == node_id:
                return spec
        raise BrokerError(f"no node {node_id} in this cluster")

    def _save(self, cluster_id: str) -> None:
        data = {
            "cluster_id": cluster_id,
            "kafka_version": self.version,
            "bootstrap": self.bootstrap,
            "nodes": [
                {"node_id": s.node_id, "port": s.port, "controller_port": s.controller_port,
                 "data_dir": str(s.data_dir), "tls_port": s.tls_port, "mtls_port": s.mtls_port,
                 "host": s.host}
                for s in self.specs
            ],
        }
        if self.security is not None:
            # The admin's connection file (0600) lets commands find this broker with no flags.
            data.update(security="sasl+tls" if self.security.tls else "sasl",
                        admin_config=str(self.security.write_client_file(self.bootstrap, ADMIN).resolve()))
            if self.security.tls:
                data.update(tls_bootstrap=self.tls_bootstrap, mtls_bootstrap=self.mtls_bootstrap,
                            ca_file=str(self.security.ca_file))
        (self.data_dir / "cluster.json").write_text(json.dumps(data, indent=2))

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(timeout=60)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Stop the nodes one by one: SIGTERM (a controlled shutdown), SIGKILL past ``timeout``.

        A node's controlled shutdown needs a controller quorum; once the nodes still running are
        fewer than a majority (the last of three), it can only wait out its timeout, so those
        get :data:`NO_QUORUM_STOP_S` (measured: a three-node teardown took 33 s, now 6)."""
        stop_nodes([spec.data_dir for spec in self.specs], timeout=timeout)
        self.procs.clear()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LocalCluster:
        # Starting and stopping JVMs blocks for seconds: off the event loop.
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def stop_nodes(node_dirs: list[Path], *, timeout: float = 30.0) -> None:
    """Stop the nodes of one cluster in order (see :meth:`LocalCluster.stop`): a node left without a
    controller quorum gets :data:`NO_QUORUM_STOP_S` instead of ``timeout``. Nodes already gone
    (killed, crashed) are no part of the quorum: with one of three dead, the second node stopped
    is the last one running (it waited out the whole ``timeout``, 30 s)."""
    quorum = len(node_dirs) // 2 + 1
    for i, node_dir in enumerate(node_dirs):
        running = sum(pid_file_alive(d / "pid") for d in node_dirs[i:])
        stop_pid_file(node_dir / "pid", timeout=timeout if running >= quorum else NO_QUORUM_STOP_S)


def pid_file_alive(pid_file: Path) -> bool:
    """Whether the process ``pid_file`` names is alive (no file, or garbage in it: not)."""
    try:
        pid = int(pid_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    return pid > 0 and _pid_alive(pid)


def stop_pid_file(pid_file: Path, *, timeout: float = 30.0) -> bool:
    """SIGTERM (and SIGCONT) the node recorded in ``pid_file``; SIGKILL it past ``timeout``."""
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().strip() or 0)
    if pid <= 0 or not _pid_alive(pid):
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    # A node a fault left stopped (SIGSTOP) acts on SIGTERM only once continued; a running one
    # ignores SIGCONT. Without it, a paused node waited out the whole timeout and was killed.
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.1)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        while _pid_alive(pid):
            time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    return True


def wait_ready(conn: clients.Conn, *, timeout: float = 90.0, expect_brokers: int = 1,
               procs: list[subprocess.Popen[bytes]] | None = None) -> None:
    """Poll cluster metadata until ``expect_brokers`` brokers answer, or raise BrokerError."""
    # The runner starts any release it is asked for: refusing untested ones is for commands.
    ready_conn = dataclasses.replace(clients.connection(conn), allow_untested_kafka=True)
    asyncio.run(_wait_ready(ready_conn, timeout, expect_brokers, procs or []))


async def _wait_ready(conn: clients.Connection, timeout: float, expect: int,
                      procs: list[subprocess.Popen[bytes]]) -> None:
    # aiokafka logs every refused connection at ERROR; while the JVM boots those are expected.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise BrokerError(f"broker process exited with code {p.returncode}; see its server.log")
        client = clients.admin(conn, request_timeout_ms=5000)
        try:
            await client.start()
            brokers = (await client.describe_cluster())["brokers"]
            # A broker is listed once registered; its client listener may accept a moment later.
            if len(brokers) >= expect and await _all_accept(brokers):
                logging.getLogger("aiokafka").setLevel(logging.NOTSET)
                return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = exc
        finally:
            await client.close()
        await asyncio.sleep(0.3)
    logging.getLogger("aiokafka").setLevel(logging.NOTSET)
    raise BrokerError(f"broker at {conn.bootstrap} not ready after {timeout:.0f}s ({type(last).__name__})")


async def _all_accept(brokers: list[dict[str, Any]]) -> bool:
    """Whether every listed broker accepts a connection on its advertised address."""
    for b in brokers:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(b["host"], int(b["port"])), 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        await writer.wait_closed()
    return True


def status(data_dir: Path) -> dict[str, object]:
    state = data_dir / "cluster.json"
    if not state.exists():
        return {"running": False, "data_dir": str(data_dir)}
    saved = json.loads(state.read_text())
    alive = []
    for node in saved["nodes"]:
        pid_file = Path(node["data_dir"]) / "pid"
        pid = int(pid_file.read_text().strip()) if pid_file.exists() else 0
        alive.append(pid > 0 and _pid_alive(pid))
    return {"running": all(alive) and bool(alive), "nodes_alive": sum(alive),
            "bootstrap": saved["bootstrap"], "kafka_version": saved["kafka_version"],
            "data_dir": str(data_dir), "security": saved.get("security", "none"),
            **{k: saved[k] for k in ("admin_config", "tls_bootstrap", "mtls_bootstrap", "ca_file")
               if k in saved}}
