"""``TestApp``: your unmodified app, in process, on the in-memory Kafka, with a virtual clock.

::

    async with TestApp(app) as t:
        await t.emit(type="due", tenant="acme", target=["inv-42"], payload={"amount": 1250})
        assert t.outcome(type="due", tenant="acme", target=["inv-42"]).kind is OutcomeKind.SUCCEEDED
        await t.advance(minutes=10)          # retries, future due times and schedules come due
        assert t.dead_letters() == []

The unit-test layer beneath the pytest plugin (:mod:`streamsched.testing.plugin`, real Kafka,
real processes, crashes): no broker, no sleeps, the same answer on every run. It behaves like the
real worker because it IS the worker's code (see :mod:`streamsched.testing.virtual`): the turn,
the claim state machine, the due index, the transaction shapes, dead letters, parking, offsets,
on :mod:`streamsched.testing.fakes`, which model transactions, the last stable offset, abort
markers and fencing. What it does not model is what the fakes leave out (replication, rebalances,
timeouts, request sizes); the worker's own waits run on the virtual clock, only its guards
(a lease's end, a transaction's deadline) stay in real time (see :mod:`streamsched.testing.virtual`).

Every call that writes (``emit``, ``produce``, ``advance``) returns once everything it caused is
resolved and committed, so the test reads the result right after, never polls.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiokafka.errors import UnknownTopicOrPartitionError

from streamsched.errors import ConfigError
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, Outcome
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.jsonval import json_dumps
from streamsched.testing.fakes import FakeKafka, FakeRecord
from streamsched.testing.virtual import Clocked, SchedulerRig, VirtualClock, settle
from streamsched.wire.claim import decode_claim
from streamsched.wire.control import AuditEntry, RedriveRequest, redrive_record
from streamsched.wire.dead_letter import DeadLetterView, view_dead_letter
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import encode_transition
from streamsched.worker.app import App, SchedulerDef

__all__ = ["DEFAULT_START_NS", "TestApp"]

DEFAULT_START_NS = 1_767_225_600 * 1_000_000_000
"""2026-01-01T00:00:00Z: where the virtual clock starts unless told (fixed, so runs repeat)."""
_NS = {"seconds": 10**9, "minutes": 60 * 10**9, "hours": 3600 * 10**9, "days": 86_400 * 10**9}
MAX_STEPS = 100_000
"""Most clock steps one ``advance`` takes (each stops at the next due item or tick)."""


@dataclass(frozen=True)
class RedriveRecord:
    """A re-drive (or cancel) request as the delay-topic record that carries it."""

    topic: str
    value: bytes | None
    key: bytes
    partition: int
    headers: list[tuple[str, bytes]]


class TestApp:
    """Run ``app``'s schedulers (all, or the ``schedulers`` named) as one worker owning every
    partition, on a fresh :class:`FakeKafka` whose clock is the virtual one.

    ``partitions``: of every topic (an int), or per topic name (a mapping, default 1).
    ``start_ns``: where the virtual clock starts. ``timeout_s``: real seconds a settle may take
    before it fails naming the busy partitions (a handler awaiting something that never comes).
    """

    __test__ = False  # a library class, not a pytest test class

    def __init__(self, app: App | SchedulerDef, *, schedulers: Iterable[str] | None = None,
                 partitions: int | Mapping[str, int] = 1, start_ns: int = DEFAULT_START_NS,
                 owner: str = "testapp", seed: int = 0, timeout_s: float | None = None) -> None:
        if isinstance(app, SchedulerDef):
            chosen = [app]
        else:
            chosen = [s for name in schedulers for s in app.select(name)] if schedulers is not None \
                else app.select()
        if not chosen:
            raise ConfigError("TestApp needs at least one scheduler")
        self.schedulers: dict[str, SchedulerDef] = {s.name: s for s in chosen}
        self.clock = VirtualClock(start_ns)
        self.kafka = FakeKafka(clock_ms=self.clock.ms)
        self._partitions = partitions
        self._owner, self._seed = owner, seed
        self._incarnations = itertools.count(1)
        self._rigs = self._new_rigs()
        self._clocked: list[Clocked] = []
        self._ids = itertools.count(1)
        self.timeout_s = timeout_s if timeout_s is not None else max(
            30.0, max(s.claim_duration_s for s in chosen) + 5.0)
        self._started = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> TestApp:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the topics and start one owner per partition of every scheduler."""
        self._create_topics()
        for rig in self._rigs:
            await rig.start()
        self._started = True
        await self.settle()

    async def stop(self) -> None:
        """Stop as a worker does on SIGTERM: in-flight work resolves and commits first."""
        if not self._started:
            return
        self._started = False
        for rig in self._rigs:
            await rig.stop()

    async def restart(self, *, crash: bool = False) -> None:
        """Replace the worker by a new process (a new owner id), which fences the old one,
        restores the claim state from the state topic and resumes at the committed offsets.

        ``crash=True``: the old one dies at once instead of draining: running handlers are
        cancelled mid-effect, its open transactions stay open until the new owner's producers
        fence them, nothing it had not committed counts. A claim it committed is honoured until
        its lease expires (``advance`` past it), then taken over with a higher fence.
        """
        if crash:
            for rig in self._rigs:
                await rig.crash()
            self._started = False
        else:
            await self.stop()
        self._rigs = self._new_rigs()
        await self.start()

    def _new_rigs(self) -> list[SchedulerRig]:
        owner = f"{self._owner}-{next(self._incarnations)}"
        return [SchedulerRig(s, self.kafka, self.clock, owner=owner, seed=self._seed)
                for s in self.schedulers.values()]

    def ensure_topic(self, topic: str, partitions: int | None = None) -> str:
        """Create ``topic`` in the fake cluster unless it exists (``partitions``: else the default)."""
        try:
            self.kafka.partitions(topic)
        except UnknownTopicOrPartitionError:
            self.kafka.create_topic(topic, partitions or self._partition_count(topic))
        return topic

    def attach(self, component: Clocked) -> None:
        """Drive ``component`` (e.g. a schedule ticker) by the virtual clock too."""
        self._clocked.append(component)

    def _partition_count(self, topic: str) -> int:
        if isinstance(self._partitions, int):
            return self._partitions
        return self._partitions.get(topic, 1)

    def _create_topics(self) -> None:
        for s in self.schedulers.values():
            for topic in (s.topic, *sorted(s.outputs)):
                self.ensure_topic(topic)
        for s in self.schedulers.values():
            n = self.kafka.partitions(s.topic)  # co-partitioned, as the worker creates them
            for internal in (s.state_topic, s.dead_letter_topic, s.delay_topic, s.audit_topic):
                self.ensure_topic(internal, n)

    # --- time ---------------------------------------------------------------------------------

    @property
    def now_ns(self) -> int:
        """The virtual clock (UTC ns): what handlers, claims, leases and the ticker see."""
        return self.clock.now_ns

    async def settle(self) -> None:
        """Until everything read is resolved and committed and nothing more is due now."""
        self._check_started()
        await settle(self._rigs, self._clocked, timeout_s=self.timeout_s)

    async def advance(self, ns: int = 0, *, seconds: float = 0, minutes: float = 0, hours: float = 0,
                      days: float = 0) -> None:
        """Move the virtual clock forward, stopping at every due item and tick on the way (so
        each runs at its own time, as on a worker that was up all along), then settle."""
        delta = ns + int(seconds * _NS["seconds"] + minutes * _NS["minutes"] + hours * _NS["hours"]
                         + days * _NS["days"])
        if delta < 0:
            raise ValueError("time only moves forward")
        target = self.clock.now_ns + delta
        await self.settle()
        for _ in range(MAX_STEPS):
            sources: list[SchedulerRig | Clocked] = [*self._rigs, *self._clocked]
            due = [d for d in (c.next_due_ns() for c in sources) if d is not None]
            nxt = min(due, default=None)
            if nxt is None or nxt > target:
                break
            self._set_clock(max(nxt, self.clock.now_ns + 1))
            await self.settle()
        else:
            raise RuntimeError(f"advance took {MAX_STEPS} steps without reaching its target")
        self._set_clock(target)
        await self.settle()

    def _set_clock(self, ns: int) -> None:
        self.clock.set(ns)
        for rig in self._rigs:
            rig.wake_all()

    # --- input --------------------------------------------------------------------------------

    def event(self, type: str = "due", tenant: str = "", target: Iterable[str] = (), *,
              payload: object = None, due_ns: int = 0, event_id: str | None = None,
              attempt: int = 1) -> TransitionEvent:
        """A transition as a service would produce it, now (``event_id``: a counter by default)."""
        body = payload if isinstance(payload, bytes) else json_dumps({} if payload is None else payload)
        return TransitionEvent(event_id=event_id or f"evt-{next(self._ids)}", type=type, tenant=tenant,
                               target=tuple(target), due_ns=due_ns, payload=body,
                               produced_ns=self.clock.now_ns, attempt=attempt)

    async def emit(self, *events: TransitionEvent, topic: str | None = None,
                   **fields: Any) -> list[TransitionEvent]:
        """Produce ``events`` (or one built from ``fields``, see :meth:`event`) as
        :class:`streamsched.Producer` does (validated, route key, murmur2 home partition), then
        settle. ``topic``: the schedulers' topic when they share one."""
        if fields:
            events = (*events, self.event(**fields))
        chosen = topic or self._default_topic()
        for ev in events:
            value = encode_transition(ev)  # DecodeError/BoundExceeded before anything is written
            self.kafka.produce(chosen, value, key=route_key(ev.tenant, ev.target))
        await self.settle()
        return list(events)

    async def produce(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                      partition: int | None = None) -> FakeRecord:
        """Write one raw record (anything: poison included), then settle."""
        rec = self.kafka.produce(topic, value, key=key, partition=partition)
        await self.settle()
        return rec

    async def redrive(self, event: TransitionEvent | str, *, scheduler: str | None = None, reason: str = "",
                      force: bool = False, principal: str = "User:test") -> None:
        """Re-drive an identity as ``streamsched redrive`` does: a request at the revision its state
        has now, to the scheduler's delay topic in the identity's home partition; then settle.
        Given an event, the owner reopens the identity and runs that event again; given an
        identity, it only reopens (its next delivery runs)."""
        self.produce_redrive(self.redrive_request(event, scheduler=scheduler, reason=reason, force=force,
                                                  principal=principal))
        await self.settle()

    def produce_redrive(self, record: RedriveRecord, *, topic: str | None = None) -> None:
        """Write ``record`` (to its delay topic, or to ``topic``), without settling."""
        self.kafka.produce(topic or record.topic, record.value, key=record.key,
                           partition=record.partition if topic is None else None, headers=record.headers)

    def redrive_request(self, event: TransitionEvent | str, *, scheduler: str | None = None, reason: str = "",
                        force: bool = False, principal: str = "User:test") -> RedriveRecord:
        """The record :meth:`redrive` produces, not produced: a test may write it twice, or
        elsewhere, with :meth:`produce_redrive`."""
        s = self.scheduler(scheduler)
        identity = event if isinstance(event, str) else self.identity(event, scheduler=s.name)
        key = identity.encode()
        found = [(r.partition, r.value) for r in self.kafka.records(s.state_topic) if r.key == key]
        if not found or found[-1][1] is None:
            raise ConfigError("no claim of this identity is stored: nothing to re-drive")
        partition, raw = found[-1]
        assert raw is not None
        request = RedriveRequest.new(identity, decode_claim(raw).revision, principal=principal,
                                     at_ns=self.clock.now_ns, reason=reason, force=force)
        if isinstance(event, str):
            key, value, headers = redrive_record(request, None, None)
        else:
            key, value, headers = redrive_record(request, encode_transition(event),
                                                 route_key(event.tenant, event.target))
        return RedriveRecord(s.delay_topic, value, key, partition, headers)

    async def cancel(self, event: TransitionEvent | str, *, scheduler: str | None = None,
                     reason: str = "test", principal: str = "User:test") -> None:
        """Cancel an identity's waiting work as ``streamsched cancel`` does (a request at the
        revision its state has now, 0 if none is stored); then settle."""
        self.produce_redrive(self.cancel_request(event, scheduler=scheduler, reason=reason,
                                                 principal=principal))
        await self.settle()

    def cancel_request(self, event: TransitionEvent | str, *, scheduler: str | None = None,
                       reason: str = "test", principal: str = "User:test") -> RedriveRecord:
        """The record :meth:`cancel` produces, not produced (see :meth:`redrive_request`). An
        identity never claimed is found by its event's route key (a bare one: ConfigError)."""
        s = self.scheduler(scheduler)
        identity = event if isinstance(event, str) else self.identity(event, scheduler=s.name)
        key = identity.encode()
        found = [(r.partition, r.value) for r in self.kafka.records(s.state_topic) if r.key == key]
        if found:
            partition, raw = found[-1]
            revision = decode_claim(raw).revision if raw is not None else 0
        elif isinstance(event, str):
            raise ConfigError("no claim of this identity is stored: cancel it by its event")
        else:
            partitions = self.kafka.partitions(s.topic)
            partition = partition_for_key(route_key(event.tenant, event.target), partitions)
            revision = 0
        request = RedriveRequest.new(identity, revision, principal=principal, at_ns=self.clock.now_ns,
                                     reason=reason, action="cancel")
        key, value, headers = redrive_record(request, None, None)
        self.ensure_topic(s.delay_topic)
        return RedriveRecord(s.delay_topic, value, key, partition, headers)

    def audit(self, event: TransitionEvent | str, *, scheduler: str | None = None) -> list[AuditEntry]:
        """The committed audit entries of an identity (what its owners did with re-drives and cancels)."""
        s = self.scheduler(scheduler)
        identity = event if isinstance(event, str) else self.identity(event, scheduler=s.name)
        key = identity.encode()
        return [AuditEntry.decode(r.value) for r in self.kafka.records(s.audit_topic) if r.key == key]

    def _default_topic(self) -> str:
        topics = {s.topic for s in self.schedulers.values()}
        if len(topics) != 1:
            raise ConfigError(f"the schedulers read {len(topics)} topics: pass topic=")
        return next(iter(topics))

    # --- results ------------------------------------------------------------------------------

    def scheduler(self, name: str | None = None) -> SchedulerDef:
        if name is None:
            if len(self.schedulers) != 1:
                raise ConfigError(f"{len(self.schedulers)} schedulers run here: name one")
            return next(iter(self.schedulers.values()))
        if name not in self.schedulers:
            raise ConfigError(f"no scheduler {name!r} runs here")
        return self.schedulers[name]

    def identity(self, event: TransitionEvent | None = None, *, scheduler: str | None = None,
                 **fields: Any) -> str:
        """The business identity ``scheduler`` gives ``event`` (or the event of ``fields``:
        ``type``, ``tenant``, ``target``, ``due_ns``; other fields do not enter identities)."""
        if event is None:
            event = self.event(**{"event_id": "identity-probe", **fields})
        if scheduler is None:
            matching = [s for s in self.schedulers.values() if s.selection.matches(event)]
            if len(matching) != 1:
                raise ConfigError(f"{len(matching)} schedulers select this event: pass scheduler=")
            s = matching[0]
        else:
            s = self.scheduler(scheduler)
        return s.resolve_identity(event.due_ns, event.tenant, event.target)

    def history(self, event: TransitionEvent | str | None = None, *, scheduler: str | None = None,
                **fields: Any) -> list[ClaimState | None]:
        """Every committed snapshot of the identity (an identity string, an event, or the fields
        of one), oldest first: claims, then the release with the outcome; ``None`` for the
        tombstone written once the outcome passed the outcome horizon. What a read_committed
        reader of the state topic sees."""
        identity = event if isinstance(event, str) else self.identity(event, scheduler=scheduler, **fields)
        chosen = [self.scheduler(scheduler)] if scheduler is not None else list(self.schedulers.values())
        key = identity.encode()
        return [decode_claim(r.value) if r.value is not None else None
                for s in chosen for r in self.kafka.records(s.state_topic) if r.key == key]

    def state(self, event: TransitionEvent | str | None = None, *, scheduler: str | None = None,
              **fields: Any) -> ClaimState | None:
        """The identity's latest committed snapshot (None: never claimed, or forgotten after the
        outcome horizon)."""
        snapshots = self.history(event, scheduler=scheduler, **fields)
        return snapshots[-1] if snapshots else None

    def outcome(self, event: TransitionEvent | str | None = None, *, scheduler: str | None = None,
                **fields: Any) -> Outcome | None:
        """The identity's stored outcome (None: none stored, e.g. parked for a retry or not due)."""
        st = self.state(event, scheduler=scheduler, **fields)
        return st.outcome if st is not None else None

    def dead_letters(self, scheduler: str | None = None) -> list[DeadLetterView]:
        """The committed dead letters of one scheduler (default: every scheduler's)."""
        chosen = [self.scheduler(scheduler)] if scheduler is not None else list(self.schedulers.values())
        return [view_dead_letter(r) for s in chosen for r in self.kafka.records(s.dead_letter_topic)]

    def emitted(self, topic: str) -> list[FakeRecord]:
        """The committed records of ``topic`` (what a read_committed consumer sees), in
        partition then offset order."""
        return self.kafka.records(topic)

    def metrics(self, scheduler: str | None = None) -> Metrics:
        """The worker's metrics of one scheduler (counters such as ``executions``, ``retries_parked``)."""
        name = self.scheduler(scheduler).name
        return next(r.metrics for r in self._rigs if r.s.name == name)

    def _check_started(self) -> None:
        if not self._started and not any(r.parts for r in self._rigs):
            raise RuntimeError("TestApp is not running: use `async with TestApp(app) as t:`")
