"""What bench/rolling.py watches: the load it sends, the group's per-partition progress and who
owns what, and the workers' call files.

* :class:`Load` sends ``rate`` due events a second, each a new identity, spread round-robin over
  the partitions (identities are drawn until one lands on the partition whose turn it is), so
  every partition gets an event every ``partitions / rate`` seconds and a partition that makes
  no progress for longer than that is stalled, not merely idle.
* :class:`Progress` polls the group's committed offsets of the transition topic (one OffsetFetch
  to the group's coordinator every ``POLL_S``) and keeps, per partition, the times at which its
  committed offset advanced (the poll's answer time: an upper bound on when it happened).
  :meth:`Progress.owners` describes the group: the transition partitions each worker process
  holds, found by its pid in the member's client id (``<host>-<pid>-<hex>``).
* :func:`read_calls`: the lines bench/rolling_app.py's command appends per call.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import os
import re
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamsched.kafka import clients
from streamsched.kafka.producer import Producer
from streamsched.kafka.writer import partition_for_key
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.testing import make_event

POLL_S = 0.1
REQUEST_TIMEOUT_MS = 5000
_PID = re.compile(r"-(\d+)-[0-9a-f]{8}$")


def log(msg: str) -> None:
    print(f"[rolling {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout: float, what: str,
                     interval: float = 0.2) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout`` passed (False, logged)."""
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            log(f"timed out after {timeout:.0f}s waiting for {what}")
            return False
        await asyncio.sleep(interval)
    return True


@dataclass
class Load:
    """``rate`` new identities a second, round-robin over the partitions, until stopped."""

    bootstrap: str
    topic: str
    partitions: int
    rate: float
    prefix: str
    sent: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    _pending: dict[int, deque[str]] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    _turn: int = 0

    def _identity_on(self, partition: int) -> str:
        # Every identity drawn is used once its partition's turn comes: one hash per event.
        while not self._pending.setdefault(partition, deque()):
            run_id = f"{self.prefix}{next(self._counter)}"
            home = partition_for_key(route_key("t", (run_id,)), self.partitions)
            self._pending.setdefault(home, deque()).append(run_id)
        return self._pending[partition].popleft()

    def batch(self, n: int) -> list[TransitionEvent]:
        events = []
        for _ in range(n):
            events.append(make_event("due", "t", [self._identity_on(self._turn)]))
            self._turn = (self._turn + 1) % self.partitions
        return events

    async def _send(self, producer: Producer, events: list[TransitionEvent]) -> None:
        ids = [e.target[0] for e in events]
        try:
            await producer.send_many(self.topic, events)
            self.sent.update(ids)
        except Exception as exc:  # noqa: BLE001 - counted apart; a failed send may still have landed
            self.failed.update(ids)
            log(f"load: a send failed: {exc!r}")

    async def run(self, stop: asyncio.Event) -> None:
        """Send on a 50 ms tick, as many as the rate owes since the start (no drift)."""
        outstanding: set[asyncio.Task[None]] = set()
        started, made = time.monotonic(), 0
        async with Producer(self.bootstrap, linger_ms=5) as producer:
            while not stop.is_set():
                owed = int(self.rate * (time.monotonic() - started)) - made
                if owed > 0 and len(outstanding) < 100:
                    made += owed
                    task = asyncio.create_task(self._send(producer, self.batch(owed)))
                    outstanding.add(task)
                    task.add_done_callback(outstanding.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
            if outstanding:
                await asyncio.wait(outstanding, timeout=30)


@dataclass(frozen=True)
class Sample:
    sent_at: float
    at: float
    offsets: dict[int, int]


class Progress:
    """The group's committed offsets per transition partition, polled every ``POLL_S``."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.group, self.topic, self.partitions = bootstrap, group, topic, partitions
        self.samples: list[Sample] = []
        self.advances: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self._admin: Any = None
        self._coordinator: int | None = None

    async def start(self) -> None:
        self._admin = clients.admin(self.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
        await self._admin.start()

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._admin.close()

    async def poll_once(self) -> None:
        from aiokafka import TopicPartition

        if self._coordinator is None:
            self._coordinator = await self._admin.find_coordinator(self.group)
        sent_at = time.time()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            committed = await self._admin.list_consumer_group_offsets(self.group, self._coordinator, tps)
        except Exception:
            self._coordinator = None  # found again at the next poll
            raise
        at = time.time()
        offsets = {tp.partition: max(0, meta.offset) for tp, meta in committed.items()
                   if tp.topic == self.topic}
        last = self.samples[-1].offsets if self.samples else {}
        for p, off in offsets.items():
            if off > last.get(p, 0):
                self.advances[p].append(at)
        self.samples.append(Sample(sent_at, at, offsets))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            began = time.monotonic()
            with contextlib.suppress(Exception):  # a failed poll costs resolution only
                await asyncio.wait_for(self.poll_once(), REQUEST_TIMEOUT_MS / 1000 + 1)
            await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - began)))

    def resumed_after(self, partition: int, since: float) -> float | None:
        """When ``partition`` first advanced past its offset at the first poll sent after ``since``."""
        i = bisect.bisect_right(self.samples, since, key=lambda s: s.sent_at)
        if i >= len(self.samples):
            return None
        base = self.samples[i].offsets.get(partition, 0)
        return next((s.at for s in self.samples[i + 1:] if s.offsets.get(partition, 0) > base), None)

    async def owners(self) -> dict[int, frozenset[int]]:
        """pid -> transition partitions held, as the group coordinator describes the group now
        (empty while the group has no coordinator yet, or when the request fails)."""
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
        from aiokafka.errors import KafkaError

        try:
            described = await self._admin.describe_consumer_groups([self.group])
        except KafkaError:
            return {}
        held: dict[int, frozenset[int]] = {}
        for resp in described:
            for group in getattr(resp, "groups", []):
                for member in group[5]:
                    # (member id[, instance id], client id, host, metadata, assignment): by content,
                    # not position, since the fields depend on the DescribeGroups version.
                    pid = next((int(m.group(1)) for f in member[1:-2] if isinstance(f, str)
                                and (m := _PID.search(f))), None)
                    if pid is None or not member[-1]:
                        continue
                    assignment = ConsumerProtocolMemberAssignment.decode(member[-1])
                    held[pid] = frozenset(p for t, ps in assignment.assignment if t == self.topic for p in ps)
        return held


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time within [start, end] a partition advanced at ``times`` went without
    advancing, counted from its last advance before ``start`` (so a normal gap is included)."""
    i, j = bisect.bisect_right(times, start), bisect.bisect_right(times, end)
    points = [times[i - 1] if i else start, *times[i:j], end]
    return max(b - a for a, b in itertools.pairwise(points))


@dataclass
class Calls:
    per_identity: Counter[str] = field(default_factory=Counter)
    timed: list[tuple[float, float]] = field(default_factory=list)
    """(call time, latency from the event's produce time in ms) per call, in call-time order."""

    def latencies_ms(self, start: float, end: float) -> list[float]:
        return [ms for at, ms in self.timed if start <= at <= end]


def read_calls(paths: Iterable[Path]) -> Calls:
    calls = Calls()
    for path in paths:
        with open(path) as lines:
            for line in lines:
                parts = line.split()
                if len(parts) != 3:
                    continue  # a line being written right now
                run_id, produced_ns, at_ns = parts[0], int(parts[1]), int(parts[2])
                calls.per_identity[run_id] += 1
                calls.timed.append((at_ns / 1e9, (at_ns - produced_ns) / 1e6))
    calls.timed.sort()
    return calls


def p99(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return round(statistics.quantiles(values, n=100, method="inclusive")[98], 1)
