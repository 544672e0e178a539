"""The fault matrix's harness: a fresh three-node cluster per scenario, workers as real processes,
a steady load of a reference workflow, network cuts made with namespaces and nftables, and a
black-box audit (Kafka read_committed and the SQLite ledger, never worker memory).

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
import json
import os
import random
import re
import shutil
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

from consumers.harness import (
    FAST_FAILOVER_ENV,
    Audit,
    Call,
    Workflow,
    claim_history,
    ledger_calls,
    produce,
    unresolved_below_commit,
)
from consumers.harness import audit as harness_audit
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import Lag, group_lag, read_topic
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.model.event import TransitionEvent
from streamsched.model.names import internal_topic
from streamsched.ops.broker import LocalCluster
from streamsched.testing import WorkerProcess, child_pythonpath, make_event
from streamsched.wire.transition import decode_transition

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
    is cut off, the majority's side (a deposed leader would serve it a stale log)."""
    _batch: int = 0

    @property
    def bootstrap(self) -> str:
        return self.view or self.cluster.bootstrap

    def bootstrap_without(self, broker: str) -> str:
        """The bootstrap list without ``broker`` (the test process reaches every node)."""
        return ",".join(s.bootstrap for s in self.cluster.specs if f"b{s.node_id}" != broker)

    def worker(self, name: str) -> NetnsWorker:
        self.net.add(name)
        w = NetnsWorker(self.net.prefix(name), self.wf.app_ref, self.cluster.bootstrap,
                        env={**WORKER_ENV, **self.wf.env}, log_path=self.tmp / f"{name}.log")
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
            await asyncio.sleep(every_s)

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


async def make_scenario(net: Net, tmp: Path, tag: str) -> Scenario:
    """Three brokers (one namespace each; RF 3, min.insync.replicas 2) and the due_runs workflow
    with every topic replicated three ways."""
    hosts = [net.add(f"b{i}") for i in (1, 2, 3)]
    cluster = LocalCluster(data_dir=tmp / "cluster", nodes=3, hosts=hosts, heap="-Xmx384m",
                           launch_prefix=lambda spec: net.prefix(f"b{spec.node_id}"))
    try:
        await asyncio.to_thread(cluster.start)
    except BaseException:
        await asyncio.to_thread(cluster.stop)
        raise
    wf = Workflow("due_runs", f".{tag}-{uuid.uuid4().hex[:8]}", tmp / "ledger.sqlite3")
    await apply(cluster.bootstrap, [
        TopicSpec(wf.topic, PARTITIONS, replication=3),
        TopicSpec(wf.state_topic, PARTITIONS, replication=3, kind="state"),
        TopicSpec(internal_topic("dlq", wf.name), PARTITIONS, replication=3, kind="dead_letter"),
        TopicSpec(internal_topic("delay", wf.name), PARTITIONS, replication=3, kind="delay"),
    ])
    return Scenario(net, cluster, wf, tmp)


# --- the audit ------------------------------------------------------------------------------------

EXPECTED_ERRORS = re.compile("|".join([
    # aiokafka, while a coordinator or a node is unreachable or moves (seen in these scenarios):
    r"ERROR aiokafka(\.\S+)? (Group Coordinator Request failed: \[Error 15\]"
    r"|Heartbeat session expired|Unable connect to node with id \d+"
    r"|Unable to update metadata from|Unable to request metadata from)",
    # ...and a request to it that the client's request bound ended (kafka/compat.bound_requests)
    # or that it did not send because the node was just skipped as unresponsive:
    r"ERROR aiokafka(\.\S+)? (Failed fetch messages from \d+: (\[Error 7\] RequestTimedOutError"
    r"|NodeNotReadyError)|Error sending HeartbeatRequest to node \d+ \[\[Error 7\] RequestTimedOutError\]"
    r"|Heartbeat send request failed: \[Error 7\] RequestTimedOutError"
    r"|Group Coordinator Request failed: NodeNotReadyError)",
]))
"""ERROR lines a network fault explains. Nothing else may log at ERROR or CRITICAL, and no
traceback may appear, except one ending in a connection-level Kafka error (:data:`EXPECTED_RAISES`)."""
EXPECTED_RAISES = re.compile(r"^(aiokafka\.errors\.)?(KafkaConnectionError|RequestTimedOutError"
                             r"|NodeNotReadyError|KafkaTimeoutError|GroupCoordinatorNotAvailableError)\b")
BAD_LOG = ("was never retrieved", "Task was destroyed but it is pending")


UNRETRIEVED_FENCED = "future: <Future finished exception=ProducerFenced("
"""KNOWN DEFECT (open, see the broker-cut scenario): after a transaction stuck on a broker cut
off from the others is given up at its deadline and its owner restarts, the old aiokafka
producer ends fenced and futures nobody awaits any more fail (``ERROR asyncio Future exception
was never retrieved``, this line, a traceback ending in ``ProducerFenced``). Found with
PYTHONASYNCIODEBUG=1 (where each future was made): the offsets future of
``send_offsets_to_transaction`` (fixed: ``settle_sends`` marks it) and the batch future made in
``MessageAccumulator.add_batch`` under a ``send_batch`` the deadline cancelled (open). Tolerated
only where a scenario says so, and counted in its result line."""


def _ends_traceback(line: str) -> bool:
    """A traceback's exception line: the first line after it that is not indented."""
    return bool(line) and not line.startswith((" ", "\t"))


def unexpected_log_lines(text: str, *, known: tuple[str, ...] = ()) -> list[str]:
    """Error lines no expected fault explains: any ``... was never retrieved``, any traceback
    not ending in a connection-level error, any ERROR/CRITICAL line not in :data:`EXPECTED_ERRORS`.
    ``known`` (e.g. :data:`UNRETRIEVED_FENCED`) lets a known defect's report through: the line
    before it, it, and its traceback."""
    bad: list[str] = []
    lines = text.splitlines()
    skip = -1
    for i, line in enumerate(lines):
        if i <= skip:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if any(b in line for b in BAD_LOG) and any(nxt.startswith(k) for k in known):
            skip = i + 1  # the known report; then its traceback, up to its exception line
            if i + 2 < len(lines) and lines[i + 2].startswith("Traceback"):
                skip = next((j for j in range(i + 3, len(lines)) if _ends_traceback(lines[j])), len(lines))
        elif any(b in line for b in BAD_LOG):
            bad.append(line)
        elif line.startswith("Traceback"):
            tail = next((x for x in lines[i + 1:] if _ends_traceback(x)), "")
            if not EXPECTED_RAISES.search(tail):
                bad.append(f"{line} ... {tail}")
        elif re.search(r" (ERROR|CRITICAL) ", line) and not EXPECTED_ERRORS.search(line):
            bad.append(line)
    return bad


@dataclass(frozen=True)
class FaultAudit:
    """:func:`consumers.harness.audit` (effects, accepted calls judged against stored outcomes,
    fences), and what a fault adds to it."""

    base: Audit
    calls_after_lease: list[str]
    """Identities with a call the ledger accepted under a fence whose lease had expired when a
    later claim took the identity over: an owner that executed after its work moved on."""
    unresolved_below_commit: list[tuple[int, int]]

    @property
    def ok(self) -> bool:
        b = self.base
        return (b.missing == 0 and b.extra_effects == 0 and b.effects == b.unique and b.fences_ok
                and b.all_released and not b.reexecuted and not b.unbacked
                and not self.calls_after_lease and not self.unresolved_below_commit)


def calls_after_lease(calls: list[Call], history: dict[str, list[ClaimState]]) -> list[str]:
    """Identities with a call accepted under a fence after that claim's lease expired, when a
    later claim took the identity over (see :attr:`FaultAudit.calls_after_lease`)."""
    expires = {(i, st.fence): st.lease_expires_ns for i, states in history.items() for st in states
               if st.status is ClaimStatus.CLAIMED}
    top = {i: max(st.fence for st in states) for i, states in history.items()}
    return sorted({c.key for c in calls if c.at_ns is not None and c.fence < top.get(c.key, 0)
                   and c.at_ns > expires.get((c.key, c.fence), c.at_ns)})


async def committed_ahead(sc: Scenario, *, settle_s: float = 0.5) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of selected events below the group's committed offset that
    are neither resolved (outcome stored) nor parked (a copy on the delay topic past the delay
    topic's committed offset): an offset committed ahead of what it stands for. A live worker
    parks an event whose identity another owner's lease holds, in the same transaction as the
    offset, so this is the invariant while workers run (``unresolved_below_commit`` of
    consumers.harness is the one for a stopped group).

    Kafka makes one transaction visible partition by partition (its markers are written in
    parallel): a violation is read again after ``settle_s`` (same committed offsets) and only
    one that persists is returned."""
    wf, delay = sc.wf, internal_topic("delay", sc.wf.name)
    committed = {t: (await group_lag(sc.bootstrap, wf.group, t)).committed for t in (wf.topic, delay)}

    async def judge() -> list[tuple[str, int, int]]:
        history = await claim_history(sc.bootstrap, wf)
        resolved = {i for i, states in history.items() if any(st.outcome is not None for st in states)}
        records = {t: await read_topic(sc.bootstrap, t) for t in (wf.topic, delay)}
        parked = {wf.identity(decode_transition(r.value)) for r in records[delay]
                  if r.offset >= committed[delay].get(r.partition, 0)}
        bad = []
        for topic, recs in records.items():
            for r in recs:
                if r.offset >= committed[topic].get(r.partition, 0):
                    continue
                ev = decode_transition(r.value)
                ident = wf.identity(ev)
                if ev.type == wf.event_type and ident not in resolved and ident not in parked:
                    bad.append((topic, r.partition, r.offset))
        return bad

    if not await judge():
        return []
    await asyncio.sleep(settle_s)
    return await judge()


async def audit(sc: Scenario) -> FaultAudit:
    late = calls_after_lease(ledger_calls(sc.wf.ledger), await claim_history(sc.bootstrap, sc.wf))
    return FaultAudit(await harness_audit(sc.bootstrap, sc.wf, sc.events), late,
                      await unresolved_below_commit(sc.bootstrap, sc.wf))


def report(sc: Scenario, name: str, result: FaultAudit, record: Any, **extra: Any) -> dict[str, Any]:
    """The scenario's result as one JSON line (printed, and a junit property)."""
    doc = {"scenario": name, "unique": result.base.unique, "calls": result.base.calls,
           "retried": result.base.retried, "recovery_s": sc.marks, **extra}
    print("FAULT-RESULT " + json.dumps(doc, sort_keys=True))
    record("fault_result", json.dumps(doc, sort_keys=True))
    return doc


def known_defects(sc: Scenario, known: str) -> int:
    """How many times the workers' logs report the known defect ``known``."""
    return sum(w.log_path.read_text(errors="replace").count(known)
               for w in sc.workers.values() if w.log_path is not None)


def assert_clean_logs(sc: Scenario, *, known: tuple[str, ...] = ()) -> None:
    for name, w in sc.workers.items():
        assert w.log_path is not None
        bad = unexpected_log_lines(w.log_path.read_text(errors="replace"), known=known)
        assert not bad, f"{name}: unexpected error lines:\n" + "\n".join(bad[:20])
