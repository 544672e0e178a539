"""Drive and audit the reference workflows on a real cluster (used by the demo and crash tests).

Audits read Kafka with read_committed and the SQLite ledger, never worker memory: what counts
is what a downstream reader would see.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Conn
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import IdentityParts, business_identity
from streamsched.model.jsonval import json_loads
from streamsched.model.names import internal_topic
from streamsched.testing import kit, make_event, produce_events
from streamsched.wire.claim import CLAIM_CODEC
from streamsched.wire.transition import decode_transition


@dataclass(frozen=True)
class Workflow:
    """One reference workflow under a namespace suffix (see consumers/*.py)."""

    kind: str  # "due_runs" | "pipelines"
    namespace: str
    ledger: Path

    @property
    def app_ref(self) -> str:
        return f"consumers.{self.kind}:app"

    @property
    def name(self) -> str:
        return self.kind + self.namespace

    @property
    def topic(self) -> str:
        base = "runs.transitions" if self.kind == "due_runs" else "pipelines.transitions"
        return base + self.namespace

    @property
    def events_topic(self) -> str:
        return "pipelines.events" + self.namespace

    @property
    def group(self) -> str:
        return f"streamsched.{self.name}"

    @property
    def state_topic(self) -> str:
        return internal_topic("state", self.name)

    @property
    def event_type(self) -> str:
        return "due" if self.kind == "due_runs" else "queued"

    @property
    def env(self) -> dict[str, str]:
        return {"STREAMSCHED_NAMESPACE": self.namespace, "STREAMSCHED_LEDGER": str(self.ledger)}

    def identity(self, ev: TransitionEvent) -> str:
        selection, kind = ("due", "complete_run") if self.kind == "due_runs" else ("queued", "start_pipeline")
        return business_identity(IdentityParts(
            scheduler=self.name, topic=self.topic, selection=selection, due_ns=ev.due_ns,
            tenant=ev.tenant, target=ev.target, attempt_kind=kind))


async def create_topics(bootstrap: str, wf: Workflow, partitions: int) -> None:
    specs = [TopicSpec(wf.topic, partitions)]
    if wf.kind == "pipelines":
        specs.append(TopicSpec(wf.events_topic, 2, kind="output"))
    await apply(bootstrap, specs)


def build_events(wf: Workflow, unique: int, duplicates: int, *, noise: int = 0,
                 seed: int = 7) -> list[TransitionEvent]:
    """``unique`` identities, ``duplicates`` extra copies spread at random, plus ``noise`` events of
    another type that the selection must ignore."""
    rng = random.Random(seed)
    base = [make_event(wf.event_type, f"tenant-{i % 5}", [f"{wf.kind}-{i}"], due_ns=1_700_000_000 * 10**9 + i)
            for i in range(unique)]
    events = list(base)
    for _ in range(duplicates):
        src = rng.choice(base)
        events.insert(rng.randrange(len(events) + 1),
                      make_event(src.type, src.tenant, src.target, due_ns=src.due_ns))
    for i in range(noise):
        events.insert(rng.randrange(len(events) + 1),
                      make_event("noise", "tenant-0", [f"noise-{i}"]))
    return events


async def produce(bootstrap: str, wf: Workflow, events: list[TransitionEvent]) -> None:
    await produce_events(bootstrap, wf.topic, events)


FAST_FAILOVER_ENV = {**kit.FAST_FAILOVER_ENV, "STREAMSCHED_CLAIM_DURATION_S": "5"}
"""Worker settings for tests that kill or pause a worker: short leases and sessions, so the
survivor takes over within seconds."""

CRASH_ENV = {
    **FAST_FAILOVER_ENV,
    # Offsets in every transaction, so a failpoint such as "after_commit:2" lands mid-stream.
    "STREAMSCHED_COMMIT_INTERVAL": "0s",
}
"""Worker settings of the crash tests: fast failover, and offsets committed with every batch."""


async def seeded_workflow(bootstrap: str, kind: str, tag: str, ledger_dir: Path, *, partitions: int,
                          unique: int, duplicates: int,
                          noise: int = 0) -> tuple[Workflow, list[TransitionEvent]]:
    """A fresh workflow (unique namespace, its ledger in ``ledger_dir``) with its topics created
    and :func:`build_events` produced to it."""
    wf = Workflow(kind, f".{tag}-{uuid.uuid4().hex[:8]}", ledger_dir / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=partitions)
    events = build_events(wf, unique=unique, duplicates=duplicates, noise=noise)
    await produce(bootstrap, wf, events)
    return wf, events


async def calls(bootstrap: Conn, wf: Workflow) -> list[Call]:
    """Every call the outside world accepted, in order: the ledger's accepted calls for
    ``due_runs``; for ``pipelines``, each committed ``pipeline.started`` event (its effect)."""
    if wf.kind == "due_runs":
        return ledger_calls(wf.ledger)
    out: list[Call] = []
    for rec in await read_topic(bootstrap, wf.events_topic):
        doc = json_loads(rec.value)
        assert isinstance(doc, dict)
        fence = doc["fence"]
        assert isinstance(fence, int)
        # No time: the event commits with its outcome (one transaction), not before it.
        out.append(Call(str(doc["idempotency_key"]), fence))
    return out


async def effects(bootstrap: Conn, wf: Workflow) -> Counter[str]:
    """Distinct business effects per identity, as the outside world keeps them: the ledger's
    ``effects`` rows (one per idempotency key, whatever the number of calls) for ``due_runs``,
    every committed event for ``pipelines``. Executions are counted by :func:`calls`."""
    if wf.kind == "due_runs":
        from consumers.ledger import Ledger

        if not wf.ledger.exists():
            return Counter()
        return Counter(key for key, _, _ in Ledger(wf.ledger).effects())
    return Counter(c.key for c in await calls(bootstrap, wf))


async def claim_history(bootstrap: Conn, wf: Workflow | str) -> dict[str, list[ClaimState]]:
    """Every committed claim snapshot per identity, in log order (of a workflow, or of the state
    topic named)."""
    return (await timed_claim_history(bootstrap, wf))[0]


async def timed_claim_history(bootstrap: Conn, wf: Workflow | str) -> tuple[
        dict[str, list[ClaimState]], dict[str, list[int]]]:
    """:func:`claim_history`, and beside each snapshot its record's timestamp (ms, producer clock)."""
    history: dict[str, list[ClaimState]] = defaultdict(list)
    stamps: dict[str, list[int]] = defaultdict(list)
    for rec in await read_topic(bootstrap, wf if isinstance(wf, str) else wf.state_topic):
        if rec.value is None:
            continue  # a tombstone past the outcome horizon (or of the fence floor)
        st = ClaimState.from_record(CLAIM_CODEC.decode(rec.value))
        history[st.identity].append(st)
        stamps[st.identity].append(rec.timestamp)
    return history, stamps


class Call(NamedTuple):
    """One accepted call of a command as its destination saw it."""

    key: str
    """The idempotency key (the business identity)."""
    fence: int
    at_ns: int | None = None
    """When the destination accepted it (wall clock, this host), if it says."""


def ledger_calls(path: Path) -> list[Call]:
    """The calls the reference ledger accepted, in the order it accepted them. Its ``effects``
    table keeps one row per idempotency key, so it cannot show a second execution; its ``calls``
    log can."""
    from consumers.ledger import Ledger

    if not path.exists():
        return []
    return [Call(key, fence, at_ns) for key, fence, accepted, at_ns in Ledger(path).calls(with_time=True)
            if accepted]


@dataclass(frozen=True)
class Executions:
    """Accepted calls per identity, judged against the outcomes the state topic stored.

    A destination observes each accepted call's idempotency key, its fence and (the reference
    ledger) when it accepted it; the state topic says under which fence each outcome was stored
    (``Outcome.fence``) and when its record was produced. A call is made *after its identity's
    outcome was stored* (``after_outcome``: always a failure) when either

    * its fence is greater than the stored outcome's: a claim is committed before its effect and
      every claim mints a higher fence than all before it, so that claim was taken after the
      outcome was in the log (clock-free); or
    * it was accepted at least a millisecond after the outcome's record was produced: the call
      that produced the outcome came before that record, a stale owner's call would be refused
      by the fence, so a later accepted call is a new execution even if its fence did not rise
      (a restart that lost its claims starts fences again). Both clocks are this host's.

    Several accepted calls before that are the at-least-once retries of attempts whose outcome
    was never stored (a crash or a lost lease between effect and outcome): allowed, and counted
    in ``retried``. An operator's re-drive (a RELEASED snapshot that clears the outcome and keeps
    the fence) reopens the identity: calls after it are a new execution, not a repeat.
    """

    calls: Counter[str]
    """Accepted calls per identity."""
    outcome_fence: dict[str, int]
    """Per identity with a stored outcome, the fence it was (first) stored under."""
    after_outcome: dict[str, list[int]]
    """Per identity called again once its outcome was stored, the fences of those calls."""
    unbacked: list[str]
    """Identities whose stored SUCCEEDED outcome no accepted call under its fence produced."""

    @property
    def retried(self) -> list[str]:
        """Identities called more than once, every call before their outcome was stored."""
        return sorted(i for i, n in self.calls.items() if n > 1 and i not in self.after_outcome)


_NEVER = float("inf")


def judge_calls(calls: Iterable[tuple[str, int] | tuple[str, int, int | None]],
                history: dict[str, list[ClaimState]],
                stamps: dict[str, list[int]] | None = None) -> Executions:
    """See :class:`Executions`. ``stamps`` (from :func:`timed_claim_history`) enables the check
    by time for calls that carry one."""
    judged = [Call(*c) for c in calls]
    fence_windows: dict[str, list[tuple[int, float]]] = {}  # (low, high]: fences claimed while stored
    time_windows: dict[str, list[tuple[float, float]]] = {}  # [start, end) ns: while stored
    first_fence: dict[str, int] = {}
    succeeded: dict[str, set[int]] = defaultdict(set)
    for identity, states in history.items():
        times = (stamps or {}).get(identity)
        by_fence: list[tuple[int, float]] = []
        by_time: list[tuple[float, float]] = []
        stored: tuple[int, float] | None = None  # (fence, record ms) of the outcome in force
        for n, st in enumerate(states):
            at_ms = float(times[n]) if times is not None else _NEVER
            if st.outcome is not None:
                first_fence.setdefault(identity, st.outcome.fence)
                if st.outcome.kind is OutcomeKind.SUCCEEDED:
                    succeeded[identity].add(st.outcome.fence)
                if stored is None:
                    stored = (st.outcome.fence, at_ms)
            elif stored is not None and st.status is ClaimStatus.RELEASED and st.fence >= stored[0]:
                # Reopened (a re-drive keeps the fence). A snapshot that lost the outcome and its
                # fence with it is no reopen: what runs after it is a second execution.
                by_fence.append((stored[0], st.fence))
                by_time.append(((stored[1] + 1) * 1e6, at_ms * 1e6))
                stored = None
        if stored is not None:
            by_fence.append((stored[0], _NEVER))
            by_time.append(((stored[1] + 1) * 1e6, _NEVER))
        fence_windows[identity], time_windows[identity] = by_fence, by_time
    after: dict[str, list[int]] = defaultdict(list)
    for c in judged:
        late = any(low < c.fence <= high for low, high in fence_windows.get(c.key, ()))
        if c.at_ns is not None:
            late = late or any(start <= c.at_ns < end for start, end in time_windows.get(c.key, ()))
        if late:
            after[c.key].append(c.fence)
    called = {(c.key, c.fence) for c in judged}
    unbacked = sorted(i for i, fences in succeeded.items() if any((i, f) not in called for f in fences))
    return Executions(calls=Counter(c.key for c in judged), outcome_fence=first_fence,
                      after_outcome=dict(after), unbacked=unbacked)


def fences_not_rising(history: dict[str, list[ClaimState]]) -> list[str]:
    """Identities whose claims break the fence rule (empty when every one holds it): claims of
    one identity take strictly increasing fences. Kafka-native items write only a RELEASED
    snapshot (claim and release in one transaction), so also: across all snapshots a fence never
    decreases, and it rises whenever the delivery ordinal rises."""
    bad = []
    for identity, states in history.items():
        fences = [s.fence for s in states if s.status is ClaimStatus.CLAIMED]
        if any(b <= a for a, b in itertools.pairwise(fences)) or any(
                b.fence < a.fence or (b.ordinal > a.ordinal and b.fence <= a.fence)
                for a, b in itertools.pairwise(states)):
            bad.append(identity)
    return bad


async def unresolved_below_commit(bootstrap: str, wf: Workflow) -> list[tuple[int, int]]:
    """(partition, offset) of selected events below the committed offset whose outcome is not
    stored: must always be empty, at any moment, even right after a crash."""
    lag = await group_lag(bootstrap, wf.group, wf.topic)
    history = await claim_history(bootstrap, wf)
    with_outcome = {i for i, states in history.items() if any(s.outcome is not None for s in states)}
    bad = []
    for rec in await read_topic(bootstrap, wf.topic):
        if rec.offset >= lag.committed.get(rec.partition, 0):
            continue
        ev = decode_transition(rec.value)
        if ev.type == wf.event_type and wf.identity(ev) not in with_outcome:
            bad.append((rec.partition, rec.offset))
    return bad


@dataclass(frozen=True)
class Audit:
    events: int
    selected: int
    unique: int
    effects: int
    duplicates_suppressed: int
    identities_with_one_effect: int
    extra_effects: int
    missing: int
    all_released: bool
    calls: int = 0
    """Accepted calls of the command for the expected identities (see :class:`Executions`)."""
    retried: int = 0
    """Identities executed more than once, every time before their outcome was stored
    (at-least-once after a crash between effect and outcome: allowed for external commands)."""
    reexecuted: tuple[str, ...] = ()
    """Identities executed again after their outcome was stored: always a failure."""
    unbacked: tuple[str, ...] = ()
    """Identities whose stored success no accepted call under its fence produced."""
    fence_breaks: tuple[str, ...] = ()
    """Identities whose fences do not rise (see :func:`fences_not_rising`)."""

    @property
    def fences_ok(self) -> bool:
        return not self.fence_breaks
    missing_ids: tuple[str, ...] = ()
    """The first identities without an effect (at most 10)."""
    extra_ids: tuple[str, ...] = ()
    """The first identities with more than one effect or an effect not expected (at most 10)."""

    def failures(self) -> list[str]:
        """Each check that failed, with the identities it concerns: what an assertion shows."""
        checks = [
            (self.effects == self.unique == self.identities_with_one_effect,
             f"effects {self.effects}, unique {self.unique}, "
             f"with one effect {self.identities_with_one_effect}"),
            (self.missing == 0, f"{self.missing} missing, e.g. {list(self.missing_ids)}"),
            (self.extra_effects == 0, f"{self.extra_effects} extra effects, e.g. {list(self.extra_ids)}"),
            (self.fences_ok, f"fences not rising: {list(self.fence_breaks[:10])}"),
            (self.all_released, "an expected identity's last claim is not released with an outcome"),
            (not self.reexecuted, f"re-executed after their outcome: {list(self.reexecuted[:10])}"),
            (not self.unbacked, f"stored success without a call: {list(self.unbacked[:10])}"),
        ]
        return [what for held, what in checks if not held]

    @property
    def ok(self) -> bool:
        return not self.failures()


async def audit(bootstrap: Conn, wf: Workflow, events: list[TransitionEvent]) -> Audit:
    selected = [ev for ev in events if ev.type == wf.event_type]
    expected = {wf.identity(ev) for ev in selected}
    seen = await effects(bootstrap, wf)
    history, stamps = await timed_claim_history(bootstrap, wf)
    judged = judge_calls(await calls(bootstrap, wf), history, stamps)
    released = all(history.get(i) and history[i][-1].status is ClaimStatus.RELEASED
                   and history[i][-1].outcome is not None for i in expected)
    total = sum(seen[i] for i in expected)
    return Audit(
        events=len(events), selected=len(selected), unique=len(expected), effects=total,
        duplicates_suppressed=len(selected) - total,
        identities_with_one_effect=sum(1 for i in expected if seen[i] == 1),
        extra_effects=sum(max(0, seen[i] - 1) for i in expected) + sum(
            c for i, c in seen.items() if i not in expected),
        missing=sum(1 for i in expected if seen[i] == 0),
        fence_breaks=tuple(fences_not_rising(history)),
        missing_ids=tuple(sorted(i for i in expected if seen[i] == 0)[:10]),
        extra_ids=tuple(sorted([i for i in expected if seen[i] > 1]
                               + [i for i, c in seen.items() if i not in expected and c])[:10]),
        all_released=bool(released),
        calls=sum(judged.calls[i] for i in expected),
        retried=len(judged.retried),
        reexecuted=tuple(sorted(judged.after_outcome)),
        unbacked=tuple(judged.unbacked),
    )
