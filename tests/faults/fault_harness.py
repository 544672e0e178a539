"""The fault matrix's harness: a fresh three-node cluster per scenario, workers as real processes,
a steady load of a reference workflow, network cuts made with namespaces and nftables, brokers
killed, restarted or paused by node id, and a black-box audit (:mod:`tests.faults.fault_audit`:
Kafka read_committed and the SQLite ledger, never worker memory; :mod:`tests.faults.fault_logs`:
the workers' logs and owner restarts).

Topology of a network scenario (:class:`Net`): one Linux bridge on the host (``10.231.K.1/24``,
K drawn per run) and, per node (each broker, each worker), a network namespace joined to the
bridge by a veth pair, the node on ``10.231.K.(10+i)``. The test process stays on the host and
reaches every node through the bridge. A cut is an nftables table *inside* one node's
namespace that drops every packet to and from the peers it is cut from (no RST: connections
hang, as behind a real partition); healing deletes that table. Deleting the namespaces and the
bridge removes everything, rules included (fixtures do it even on failure).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from consumers.harness import FAST_FAILOVER_ENV, Workflow, claim_history, produce
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import Coordinators, Lag, coordinators, group_lag
from streamsched.model.claims import ClaimStatus
from streamsched.model.event import TransitionEvent
from streamsched.model.names import internal_topic
from streamsched.ops.broker import LocalCluster
from streamsched.testing import WorkerProcess, child_pythonpath, make_event, wait_for

PARTITIONS = 4
WORKER_ENV = {
    **FAST_FAILOVER_ENV,  # 3 s sessions: a silent member is evicted within seconds
    "STREAMSCHED_CLAIM_DURATION_S": "5",
    "STREAMSCHED_LEDGER_LATENCY_S": "0.05",  # commands in flight when the cut comes
    "STREAMSCHED_REPLICATION": "3",
}
PROGRESS_S = 60.0
"""A fault must not stall the group longer than this: past it the scenario fails."""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def network_tools_missing() -> str | None:
    """Why network cuts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network cuts need root (network namespaces, veth, nftables)"
    for tool, pkg in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian package {pkg}; `make fault-tools`)"
    probe = f"ssfprobe{uuid.uuid4().hex[:6]}"
    made = _run("ip", "netns", "add", probe, check=False)
    try:
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        nft = _run("ip", "netns", "exec", probe, "nft", "add table inet probe", check=False)
        if nft.returncode != 0:
            return f"nftables does not work in a network namespace: {nft.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Net:
    """A bridge and one namespace per node; see the module docstring."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    subnet: int = 0
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """node name -> (namespace, address)"""

    @property
    def bridge(self) -> str:
        return f"ssb{self.tag}"

    def up(self) -> Net:
        used = _run("ip", "-4", "addr").stdout
        free = [k for k in range(1, 255) if f"10.231.{k}." not in used]
        self.subnet = random.choice(free)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"10.231.{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        return self

    def add(self, name: str) -> str:
        """A namespace for node ``name`` on the bridge; returns its address."""
        i = len(self.nodes)
        ns, host_if, addr = f"ssf{self.tag}-{name}", f"ssv{self.tag}{i}", f"10.231.{self.subnet}.{10 + i}"
        _run("ip", "netns", "add", ns)
        self.nodes[name] = (ns, addr)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", host_if, "master", self.bridge, "up")
        for cmd in (["addr", "add", f"{addr}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                    ["link", "set", "lo", "up"]):
            _run("ip", "-n", ns, *cmd)
        return addr

    def prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program in node ``name``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[name][0]]

    def cut(self, name: str, peers: list[str]) -> None:
        """Drop every packet between node ``name`` and ``peers`` (node names)."""
        addrs = ", ".join(self.nodes[p][1] for p in peers)
        rules = (f"table inet fault {{\n"
                 f"  chain in {{ type filter hook input priority 0; ip saddr {{ {addrs} }} drop; }}\n"
                 f"  chain out {{ type filter hook output priority 0; ip daddr {{ {addrs} }} drop; }}\n}}\n")
        proc = subprocess.run([*self.prefix(name), "nft", "-f", "-"], input=rules, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nft: {proc.stderr.strip()}")

    def heal(self, name: str) -> None:
        _run(*self.prefix(name), "nft", "delete", "table", "inet", "fault", check=False)

    def down(self) -> None:
        for ns, _ in self.nodes.values():
            _run("ip", "netns", "del", ns, check=False)  # its veth pair (and its rules) go with it
        _run("ip", "link", "del", self.bridge, check=False)


@contextmanager
def network() -> Iterator[Net]:
    """A :class:`Net`, always torn down; skips (fails under CI=true) where it cannot be had."""
    why = network_tools_missing()
    if why is not None:
        import components  # tests/components.py: skips here, fails under CI=true

        components.require("network namespaces + nftables", why)
    net = Net()
    try:
        yield net.up()
    finally:
        net.down()


class NetnsWorker(WorkerProcess):
    """``streamsched run --app APP`` started inside a network namespace (``ip netns exec``)."""

    def __init__(self, prefix: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = prefix

    def start(self) -> NetnsWorker:
        cwd = Path.cwd().resolve()
        env = {**os.environ, **self.env, "STREAMSCHED_BOOTSTRAP": self.bootstrap}
        env["PYTHONPATH"] = child_pythonpath([cwd], os.environ.get("PYTHONPATH"))
        cmd = [*self.prefix, sys.executable, "-m", "streamsched", "run", "--app", self.app_ref]
        assert self.log_path is not None
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        return self


@dataclass
class Scenario:
    """One fault scenario: its network, cluster, workflow, workers and load."""

    net: Net
    cluster: LocalCluster
    wf: Workflow
    tmp: Path
    workers: dict[str, NetnsWorker] = field(default_factory=dict)
    events: list[TransitionEvent] = field(default_factory=list)
    marks: dict[str, Any] = field(default_factory=dict)
    view: str = ""
    """Where the test itself produces and reads (its audits), if not every broker: while a broker
    is cut off, the majority's side (a deposed leader would serve it a stale log); while one is
    killed or paused, the others."""
    produced: int = 0
    """Batches the load has produced (each in :attr:`events` once its produce returned)."""
    _batch: int = 0

    @property
    def bootstrap(self) -> str:
        return self.view or self.cluster.bootstrap

    def bootstrap_without(self, broker: str) -> str:
        """The bootstrap list without ``broker`` (the test process reaches every node)."""
        return ",".join(s.bootstrap for s in self.cluster.specs if f"b{s.node_id}" != broker)

    def worker(self, name: str, env: dict[str, str] | None = None) -> NetnsWorker:
        """A worker in its own namespace, with :data:`WORKER_ENV` (and ``env`` over it)."""
        self.net.add(name)
        w = NetnsWorker(self.net.prefix(name), self.wf.app_ref, self.cluster.bootstrap,
                        env={**WORKER_ENV, **self.wf.env, **(env or {})}, log_path=self.tmp / f"{name}.log")
        self.workers[name] = w.start()
        return w

    @asynccontextmanager
    async def load(self) -> AsyncIterator[None]:
        """A steady load (:meth:`feed`, a batch every 0.5 s) for the duration of the block; the
        batch being produced at its end completes (so :attr:`events` is what was produced)."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.feed(None, stop=stop))
        try:
            yield
        finally:
            stop.set()
            await task

    async def feed(self, batches: int | None, *, every_s: float = 0.5, size: int = 12,
                   stop: asyncio.Event | None = None) -> None:
        """``batches`` batches (or until ``stop``) of new identities with duplicates of earlier ones."""
        rng = random.Random(len(self.events))
        for _ in itertools.repeat(None) if batches is None else range(batches):
            if stop is not None and stop.is_set():
                return
            b = self._batch
            self._batch += 1
            batch = [make_event("due", f"tenant-{i % 5}", [f"net-{b}-{i}"], due_ns=1_700_000_000 * 10**9 + b)
                     for i in range(size)]
            pool = self.events + batch
            batch += [make_event("due", d.tenant, d.target, due_ns=d.due_ns)
                      for d in rng.sample(pool, min(len(pool), size // 3))]
            rng.shuffle(batch)
            await produce(self.bootstrap, self.wf, batch)
            self.events.extend(batch)
            self.produced += 1
            await asyncio.sleep(every_s)

    async def flowing(self, batches: int = 3) -> None:
        """Until the load (:meth:`load`) has produced ``batches`` more batches: the fault that
        follows lands on work in flight, not on an idle group."""
        target = self.produced + batches

        async def produced() -> bool:
            return self.produced >= target

        await wait_for(produced, timeout=30, what=f"{batches} batches of load")

    async def owners_since(self, since_ns: int, until_ns: int | None = None) -> Counter[str]:
        """Claims taken since ``since_ns`` (and before ``until_ns``; by lease start), per worker."""
        pids = {f"-{w.pid}-": name for name, w in self.workers.items()}
        duration_ns = int(float(WORKER_ENV["STREAMSCHED_CLAIM_DURATION_S"]) * 1e9)
        out: Counter[str] = Counter()
        for states in (await claim_history(self.bootstrap, self.wf)).values():
            for st in states:
                start = st.lease_expires_ns - duration_ns
                if st.status is ClaimStatus.CLAIMED and since_ns <= start < (until_ns or start + 1):
                    out.update(n for p, n in pids.items() if p in st.owner)
        return out

    async def lag(self) -> Lag:
        return await group_lag(self.bootstrap, self.wf.group, self.wf.topic)

    async def recovery(self, label: str, *, timeout: float = PROGRESS_S,
                       since: tuple[float, dict[int, int]] | None = None) -> float:
        """Seconds until every partition has resolved (committed) what it held at the start (now,
        or ``since``: a ``time.monotonic()`` and the ends then); fail past ``timeout`` (a stall).
        Each partition's time goes in ``marks[label + "_per_partition"]``."""
        started, ends = since or (time.monotonic(), dict((await self.lag()).end))
        done: dict[int, float] = {}
        while len(done) < len(ends):
            lag = await self.lag()
            for p, end in ends.items():
                if p not in done and lag.committed.get(p, 0) >= end:
                    done[p] = round(time.monotonic() - started, 2)
            if len(done) < len(ends) and time.monotonic() - started > timeout:
                pytest.fail(f"{label}: partitions {sorted(set(ends) - set(done))} not past {ends} "
                            f"within {timeout:.0f}s (committed {lag.committed}); logs:\n{self.log_tails()}")
            await asyncio.sleep(0.25)
        self.marks[label] = max(done.values())
        self.marks[label + "_per_partition"] = dict(sorted(done.items()))
        return self.marks[label]

    def log_tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {n}\n{w.log_tail(lines)}" for n, w in self.workers.items())

    # --- broker faults, by node id ----------------------------------------------------------------

    def kill_broker(self, node: int) -> None:
        """``kill -9`` of broker ``node`` (returns once it is gone). The test's own clients leave
        it (:attr:`view`) until :meth:`restart_broker`: a bootstrap list naming a dead node costs
        them a connection attempt per client."""
        self.view = self.bootstrap_without(f"b{node}")
        self.cluster.kill_node(node, signal.SIGKILL)

    def restart_broker(self, node: int) -> None:
        """Broker ``node`` started again on its own data, in its own namespace."""
        self.cluster.start_node(node)
        self.view = ""

    @asynccontextmanager
    async def paused(self, node: int) -> AsyncIterator[None]:
        """Broker ``node`` stopped (SIGSTOP) for the block and continued (SIGCONT) after it, even
        on failure. A stopped broker still accepts connections and never answers, so the test's
        own clients leave it meanwhile (each request to it would wait out its timeout)."""
        self.view = self.bootstrap_without(f"b{node}")
        self.cluster.kill_node(node, signal.SIGSTOP)
        try:
            yield
        finally:
            self.cluster.kill_node(node, signal.SIGCONT)
            self.view = ""

    async def coordinators(self) -> Coordinators:
        return await coordinators(self.bootstrap, self.wf.group, self.wf.topic, PARTITIONS)

    async def replicas(self) -> list[dict[str, Any]]:
        """Every partition of the transition and state topics: ``leader``, ``replicas``, ``isr``."""
        admin = clients.admin(self.bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            described = await admin.describe_topics([self.wf.topic, self.wf.state_topic])
            return [{**p, "topic": t["topic"]} for t in described for p in t["partitions"]]
        finally:
            await admin.close()

    async def elected_around(self, node: int) -> bool:
        """No partition is led by ``node`` (or leaderless): the cluster has moved on without it."""
        try:
            parts = await self.replicas()
        except Exception:  # noqa: BLE001 - a request may time out while leaders move: poll again
            return False
        return all(p["leader"] not in (node, -1) for p in parts)

    async def in_sync(self, node: int) -> bool:
        """``node`` is back in every partition's in-sync replicas."""
        try:
            parts = await self.replicas()
        except Exception:  # noqa: BLE001 - as above
            return False
        return all(node in p["isr"] for p in parts)


async def make_scenario(net: Net, tmp: Path, tag: str, *, config: dict[str, str] | None = None,
                        coordinators_together: bool = False) -> Scenario:
    """Three brokers (one namespace each; RF 3, min.insync.replicas 2; ``config`` added to each
    node's properties) and the due_runs workflow with every topic replicated three ways.

    ``coordinators_together``: the workflow's name is drawn until the broker coordinating its
    group also coordinates the transactions of at least one of its partitions' owners (both
    follow from the name), so that one broker failing takes both coordinators at once."""
    hosts = [net.add(f"b{i}") for i in (1, 2, 3)]
    cluster = LocalCluster(data_dir=tmp / "cluster", nodes=3, hosts=hosts, heap="-Xmx384m",
                           extra_config=dict(config or {}),
                           launch_prefix=lambda spec: net.prefix(f"b{spec.node_id}"))
    try:
        await asyncio.to_thread(cluster.start)
    except BaseException:
        await asyncio.to_thread(cluster.stop)
        raise
    for _ in range(50):  # each draw together with probability ~0.8 (4 owners, 3 brokers)
        wf = Workflow("due_runs", f".{tag}-{uuid.uuid4().hex[:8]}", tmp / "ledger.sqlite3")
        if not coordinators_together:
            break
        found = await coordinators(cluster.bootstrap, wf.group, wf.topic, PARTITIONS)
        if found.group in found.transactions.values():
            break
    else:
        raise AssertionError("no workflow name put its group and transaction coordinators together")
    await apply(cluster.bootstrap, [
        TopicSpec(wf.topic, PARTITIONS, replication=3),
        TopicSpec(wf.state_topic, PARTITIONS, replication=3, kind="state"),
        TopicSpec(internal_topic("dlq", wf.name), PARTITIONS, replication=3, kind="dead_letter"),
        TopicSpec(internal_topic("delay", wf.name), PARTITIONS, replication=3, kind="delay"),
    ])
    return Scenario(net, cluster, wf, tmp)


@asynccontextmanager
async def scenario_on(net: Net, tmp: Path, **options: Any) -> AsyncIterator[Scenario]:
    """:func:`make_scenario` (``options`` its keywords), always torn down: cuts healed, workers
    and brokers killed. The cluster is thrown away with its data, so no broker is given a
    controlled shutdown to wait for (seconds each, a paused one its whole timeout)."""
    sc = await make_scenario(net, tmp, uuid.uuid4().hex[:6], **options)
    try:
        yield sc
    finally:
        for name in list(sc.net.nodes):
            sc.net.heal(name)
        for w in sc.workers.values():
            if w.alive():
                w.kill()
        for node in list(sc.cluster.procs):
            sc.cluster.kill_node(node, signal.SIGKILL)  # a stopped process dies of SIGKILL too
        await asyncio.to_thread(sc.cluster.stop)  # what is left: pid files
