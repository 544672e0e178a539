"""Step 4 of the turn: run one item's handler with its immutable context, and decide what a
failure means (retry in place, park for a longer backoff, or a terminal outcome).

Pure with respect to Kafka: this module never writes anything. It returns an
:class:`Execution`, which the turn writes in its next transaction.

The items of a batch execute concurrently and resolve together, so time a failing item spends
waiting holds every healthy item of its batch and the partition's commit. A delivery therefore
waits in place for at most ONE backoff step, and only a short one
(:data:`IN_PLACE_RETRY_LIMIT_S`); any further retry is parked in the delay topic and comes back
through the due index, releasing the partition meanwhile.

Running a handler costs no task and no timer unless it suspends (:class:`Bounded`): a
Kafka-native handler usually finishes in its first step, and a task plus an ``asyncio.timeout``
per item were about 12 % of such a worker's CPU (py-spy). The timeout starts when the
handler first suspends (a handler running without suspending cannot be interrupted by any
asyncio timeout anyway), with the same deadline (the claim's lease).

Every failed attempt logs one line saying what follows (:mod:`streamsched.worker.failurelog`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from types import CoroutineType
from typing import Any

from streamsched.errors import DecodeError
from streamsched.metrics import Metrics
from streamsched.model.breaker import BreakerOpen
from streamsched.model.claims import ClaimState, Outcome, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.fastinit import fast_init
from streamsched.model.jsonval import json_dumps
from streamsched.model.retry import RetryPolicy, compute_backoff, normalize_failure
from streamsched.worker import failurelog
from streamsched.worker.app import CommandContext, Emit, SchedulerDef, Turn
from streamsched.worker.flow import SCHEDULER_SCOPE, FlowControl

IN_PLACE_RETRY_LIMIT_S = 0.25
"""The longest backoff a delivery waits in place (once); longer ones, and every second retry of
the same delivery, are parked in the delay topic."""


@fast_init
@dataclass(frozen=True, slots=True)
class Execution:
    """What one execution decided; the turn writes it with the release. (No outcome, nothing
    else: the identity already held one, so the claim is only released.)"""

    outcome: Outcome | None = None
    dead: tuple[str, str] | None = None
    """(kind, safe reason) of a terminal failure, dead-lettered with the release."""
    category: str = ""
    park_until_ns: int | None = None
    """A retry too long to wait for in place: parked in the delay topic until then."""
    attempt_next: int = 0
    emits: tuple[Emit, ...] = ()
    trace: tuple[tuple[str, bytes], ...] = ()
    """Trace headers of the execution's span (the emitted events carry them; empty without an
    OpenTelemetry SDK)."""
    attempt: int = 0
    """The last attempt that ran (0: none ran); the claim state records it with the release."""
    deferred: bool = False
    """Parked until ``park_until_ns`` without charging an attempt: a circuit breaker refused the
    call, or the call failed transiently while a breaker is open (:mod:`streamsched.worker.flow`)."""


class Bounded:
    """Runs handler calls in the current task, each bounded by a deadline.

    The first step runs directly; only a call that suspends gets an ``asyncio.timeout``,
    entered then, in the same task that keeps driving it (so a timeout the handler itself
    entered during its first step also refers to the task that runs it).
    """

    __slots__ = ("_on_suspend",)

    def __init__(self, on_suspend: Callable[[], None] | None = None) -> None:
        self._on_suspend = on_suspend
        """Called once, the first time a call suspends (before it waits): the turn starts the
        rest of the batch then, so handlers that wait for each other never deadlock."""

    def note_suspend(self) -> None:
        if self._on_suspend is not None:
            on_suspend, self._on_suspend = self._on_suspend, None
            on_suspend()

    async def run(self, call: Awaitable[None], deadline_ns: int, clock: Callable[[], int]) -> None:
        if type(call) is CoroutineType:
            try:
                step = call.send(None)
            except StopIteration:
                return
            call = _Resumed(call, step)
        # else a future or another awaitable (not an ``async def`` call): awaited as before.
        self.note_suspend()
        async with asyncio.timeout(max(0.001, (deadline_ns - clock()) / 1e9)):
            await call


class _Resumed:
    """The rest of a coroutine whose first step already ran and yielded ``step``: what ``await``
    would have done with it (futures pass through to the task, errors are thrown back in)."""

    __slots__ = ("_call", "_step")

    def __init__(self, call: Coroutine[Any, Any, None], step: Any) -> None:
        self._call, self._step = call, step

    def __await__(self) -> Generator[Any, None, None]:
        call, step = self._call, self._step
        while True:
            try:
                yield step
            except GeneratorExit:
                call.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - CancelledError too: the handler sees it
                try:
                    step = call.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                step = call.send(None)
            except StopIteration:
                return


def first_attempt(st: ClaimState, ev: TransitionEvent) -> int:
    """The attempt the next execution of ``st``'s identity is. The budget is the identity's (its
    claim state), never the record's: a duplicate or a re-driven dead letter carries whatever
    attempt it was written with. One exception: a state that has never recorded an attempt in
    its first run, read with a record that carries a later one, is a retry parked by a version
    that counted on the record only (its state decodes with attempt 0); that retry goes on from
    the record's count instead of starting the budget again."""
    if st.attempt == 0 and st.run == 1 and not st.parked:
        return max(1, ev.attempt)
    return st.attempt + 1


async def execute(s: SchedulerDef, ev: TransitionEvent, st: ClaimState, *, retry: RetryPolicy,
                  clock: Callable[[], int], metrics: Metrics, rng: random.Random,
                  on_suspend: Callable[[], None] | None = None,
                  sleep: Callable[[float], Awaitable[None]] | None = None,
                  flow: FlowControl | None = None) -> Execution | None:
    """Run the handler for ``ev`` under claim ``st``; None when an outcome is already stored.
    ``on_suspend``: see :class:`Bounded`. ``sleep``: the wait of an in-place retry (default
    ``asyncio.sleep``; the test kit's virtual clock passes one that takes no real time).
    ``flow``: the scheduler's circuit breakers (None or inactive: none)."""
    if st.outcome is not None:
        metrics.inc("skipped_outcome")
        return None
    deadline = st.lease_expires_ns
    attempt = first_attempt(st, ev)
    waited_in_place = False
    bounded = Bounded(on_suspend)
    guarded = flow is not None and flow.guards_calls  # (a pause gates the partition loop only)
    while True:
        ctx = CommandContext(idempotency_key=st.identity, fence=st.fence, attempt=attempt,
                             ordinal=st.ordinal, scheduled_ns=ev.due_ns, scheduler=s.name,
                             schedule=ev.origin)
        commands = s.commands_type(s.name, s.commands, ctx, flow if guarded else None)
        try:
            seen = ev if ev.attempt == attempt else dataclasses.replace(ev, attempt=attempt)
            if not guarded:
                await bounded.run(s.handler(Turn(seen, ctx, commands)), deadline, clock)
            else:
                assert flow is not None
                if (wait := flow.reserve(SCHEDULER_SCOPE)) > 0:
                    bounded.note_suspend()  # the rest of the batch runs meanwhile
                    await flow.sleep(wait)
                with flow.handler():
                    await bounded.run(s.handler(Turn(seen, ctx, commands)), deadline, clock)
        except BreakerOpen as exc:
            assert flow is not None
            metrics.inc("breaker_deferred")
            return _deferred(st, flow, exc.retry_at_ns, clock)
        except Exception as exc:  # noqa: BLE001 - handlers may raise anything; it is normalized
            failure = normalize_failure(exc, attempt=attempt, policy=retry, now_ns=clock())
            metrics.error(exc)
            if guarded and failure.category == "transient":
                assert flow is not None
                until = flow.blocked_until_ns()
                if until is not None:
                    # It failed as a breaker says the system it calls is down: the outage's
                    # failure, not the item's, so no attempt is charged for it.
                    metrics.inc("breaker_deferred")
                    failurelog.attempt_failed(s.name, st.identity, failure,
                                              "deferred while the circuit breaker is open", exc)
                    return _deferred(st, flow, until, clock)
            delay = compute_backoff(retry, attempt, rand=rng.random())
            fits = clock() + int(delay * 1e9) < deadline
            if failure.retryable and not waited_in_place and delay <= IN_PLACE_RETRY_LIMIT_S and fits:
                # One short step in place saves a delay-topic round trip for a blip; a second
                # one would hold the healthy items of this batch again.
                waited_in_place = True
                failurelog.attempt_failed(s.name, st.identity, failure, f"retried in place in {delay:.2f} s",
                                          exc)
                bounded.note_suspend()  # the sleep would hold whatever runs after it in this task
                metrics.inc("retries")
                await (sleep or asyncio.sleep)(delay)
                attempt += 1
                continue
            if failure.retryable:
                # Too long (or too often) to wait holding the partition: park it in the delay
                # topic, release the claim without an outcome, and let the offset move on.
                metrics.inc("retries_parked")
                failurelog.attempt_failed(s.name, st.identity, failure, f"retry parked for {delay:.2f} s",
                                          exc)
                return Execution(park_until_ns=clock() + int(delay * 1e9), attempt_next=attempt + 1,
                                 attempt=attempt)
            metrics.inc("terminal", kind=failure.cause_kind)
            last = ("dead-lettered" if failure.category == "permanent"
                    else f"dead-lettered after {failure.max_attempts} attempts")
            failurelog.attempt_failed(s.name, st.identity, failure, last, exc)
            return Execution(outcome=Outcome(OutcomeKind.FAILED, st.fence, clock(),
                                             error_kind=failure.cause_kind),
                             dead=("terminal", failure.cause_kind), category=failure.category,
                             attempt=attempt)
        emits = tuple(commands.emitted)
        metrics.inc("executions")
        return Execution(outcome=Outcome(OutcomeKind.SUCCEEDED, st.fence, clock(), events=len(emits),
                                         digest=_digest(commands.results, emits)), emits=emits,
                         attempt=attempt)


def _deferred(st: ClaimState, flow: FlowControl, until_monotonic_ns: int,
              clock: Callable[[], int]) -> Execution:
    """Parked until the breaker probes, the attempt count unchanged."""
    wait_ns = max(1_000_000, until_monotonic_ns - flow.monotonic())
    return Execution(park_until_ns=clock() + wait_ns, attempt_next=st.attempt + 1, deferred=True)


def _digest(results: tuple[object, ...], emits: tuple[Emit, ...]) -> bytes:
    h = hashlib.sha256()
    for r in results:
        try:
            h.update(json_dumps(r))
        except (DecodeError, TypeError):
            h.update(type(r).__name__.encode())
    for e in emits:
        h.update(e.topic.encode() + b"\x00" + e.value)
    return h.digest()
