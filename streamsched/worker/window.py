"""The claim-first shape: durable claims before effects, over a sliding window of claims.

Any scheduler with an external command runs this way: a claim is durable before its effect, so
an external destination always receives a fence no other owner can reuse.

The window. At most ``max_in_flight`` items of a partition are claimed and unresolved at any
committed point, but they do not move in lock-step batches: each claimed item executes as soon
as its claim commits, and as soon as it finishes, the next transaction releases it (outcome,
emits, release) and claims the next records in its place. A slow command therefore holds one
slot, not a whole batch (a batch waiting for its slowest item kept 24 of 64 slots busy on
average with a 20 ms command). One transaction carries every release that finished since the
last one and every claim that fits; transactions follow each other as fast as the broker
commits them, so releases and claims batch themselves under load.

Offsets never lead state: records are admitted in offset order, in batches; a batch resolves
when its every leader's release committed, and the committed offset only moves over the longest
resolved *prefix* of admitted batches (the lowest unresolved record bounds it). Under load the
offsets ride at most every ``commit_interval_s``; when the partition goes idle, at once.

An identity already claimed in the window is not claimed again: a later record of it is a
follower (it resolves with its batch; the running execution covers it), exactly like a
duplicate inside one batch.

Handlers run in the turn's own task, one after another, until the first one suspends (I/O): it
finishes there, and from then on every item runs as its own task, started when its claim commits
(:attr:`~streamsched.worker.steps.PartitionSteps.concurrent`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from streamsched import failpoints
from streamsched.worker.checkpoint import Checkpoint, Marks, TxnSettings
from streamsched.worker.offsets import Offsets, Span
from streamsched.worker.selection import Batch
from streamsched.worker.steps import Claim, PartitionSteps, Resolved, resolution_failpoints

WINDOW_WAIT_S = 1.0
"""Longest the partition loop sleeps while claims run and nothing else is in hand (an ending
execution wakes it at once)."""
ADMITTED_RECORDS_PER_SLOT = 8
"""Records admitted but unresolved, per slot of the window, at most (a slow leader ahead of a
flood of duplicates or dead letters must not let admitted records grow without bound)."""


@dataclass(slots=True, eq=False)
class _Admitted:
    """A batch in the window, how many of its leaders are not yet resolved, and the results of
    those that are (counted when the whole batch is)."""

    batch: Batch
    unresolved: int
    results: list[Resolved] = field(default_factory=list)


class ClaimWindow:
    """Claim-first turns of one partition over a sliding window of ``max_in_flight`` claims."""

    def __init__(self, steps: PartitionSteps, txn: TxnSettings, offsets: Offsets, *,
                 max_in_flight: int, commit_interval_s: float, count_tenants: bool = False) -> None:
        self.steps = steps
        self.txn = txn
        self.offsets = offsets
        self.max_in_flight = max_in_flight
        self.commit_interval_s = commit_interval_s
        self.admitted: deque[_Admitted] = deque()
        self.claimed: dict[str, _Admitted] = {}
        """Identities claimed and not yet resolved -> their batch."""
        self.count_tenants = count_tenants
        self.tenants: Counter[str] = Counter()
        """Claims of :attr:`claimed` by tenant, kept only with ``count_tenants`` (the cap of
        :mod:`streamsched.worker.fairness`; nothing on the hot path without it)."""
        self.finished: list[Resolved] = []
        """Claims whose execution ended; their release goes into the next transaction."""
        self.tasks: set[asyncio.Task[Resolved]] = set()
        self.failure: BaseException | None = None
        self.progress = asyncio.Event()
        """Set whenever an execution ends."""
        self.notify: Callable[[], None] = lambda: None
        """Called whenever an execution ends (the partition loop's wake-up)."""
        self.last_offsets = time.monotonic()

    # --- what the partition loop asks -------------------------------------------------------------

    def claims(self, identity: str) -> bool:
        """Whether ``identity`` is claimed in the window (a later record of it is a follower)."""
        return identity in self.claimed

    def tenant_load(self, tenant: str) -> int:
        """Claims ``tenant`` holds in the window now."""
        return self.tenants[tenant]

    def room(self) -> int:
        """How many more records may be admitted now."""
        records = sum(len(a.batch.items) for a in self.admitted)
        if records >= ADMITTED_RECORDS_PER_SLOT * self.max_in_flight:
            return 0
        # Finished items are released by the same transaction that claims the new ones.
        return max(0, self.max_in_flight - len(self.claimed) + len(self.finished))

    @property
    def pending(self) -> Batch | None:
        """The oldest admitted batch not yet resolved."""
        return self.admitted[0].batch if self.admitted else None

    @property
    def idle(self) -> bool:
        return not self.admitted and not self.claimed and not self.offsets.unsent()

    def wait_s(self, *, in_hand: bool) -> float:
        """How long the partition loop may wait before stepping with no new records (0: now);
        ``in_hand``: records wait for room in the window (then offsets wait for their interval).
        An ending execution wakes the loop earlier (:attr:`notify`)."""
        if self.finished or self.failure is not None:
            return 0.0
        if self.offsets.unsent():
            if not in_hand:
                return 0.0
            return max(0.0, self.commit_interval_s - (time.monotonic() - self.last_offsets))
        return WINDOW_WAIT_S if self.claimed else 0.0

    # --- the turn --------------------------------------------------------------------------------

    async def step(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        """One transaction: release what finished, claim ``incoming``'s leaders, maybe commit
        offsets; then start executing the new claims."""
        if self.failure is not None:
            raise self.failure
        finished, self.finished = self.finished, []
        self.progress.clear()
        try:
            started = await self._commit(finished, incoming, flush_offsets=flush_offsets)
        except BaseException:
            self.finished[:0] = finished  # still unresolved: the window is as before
            raise
        if started:
            await self._start(started)

    async def _commit(self, finished: list[Resolved], incoming: Batch | None, *,
                      flush_offsets: bool) -> list[Claim]:
        """The transaction of :meth:`step`; returns the claims it made (to run now)."""
        await self.steps.resolve_feedback(finished)
        leaders = incoming.leaders if incoming is not None else ()
        ending = Counter(id(self.claimed[r.identity]) for r in finished)
        entered = _Admitted(incoming, len(leaders)) if incoming is not None else None
        window = [*self.admitted, entered] if entered is not None else list(self.admitted)
        left = {id(a): a.unresolved - ending[id(a)] for a in window}
        # Batches whose last leader resolves now (a batch without leaders as it enters).
        resolving = [a for a in window if left[id(a)] == 0 and (ending[id(a)] or a is entered)]
        prefix = list(itertools.takewhile(lambda a: left[id(a)] == 0, window))
        span = Span(max((a.batch.next_offset for a in prefix if a.batch.next_offset is not None),
                        default=None), [o for a in prefix for o in a.batch.delayed])
        t_mark, d_mark = self.offsets.after(span)
        changed = t_mark != self.offsets.t_sent or d_mark != self.offsets.d_sent
        due = time.monotonic() - self.last_offsets >= self.commit_interval_s
        marks = Marks(t_mark, d_mark) if changed and (flush_offsets or due) else None
        expiring = self.txn.state.take_expired(self.steps.clock())  # past the outcome horizon
        if not finished and entered is None and marks is None and not expiring:
            return []
        cp = Checkpoint(self.txn)
        self.steps.write_resolution(finished, cp)
        for adm in resolving:
            self.steps.write_others(adm.batch.others(), cp)
        claims = self.steps.write_claims(leaders, cp) if leaders else []
        await cp.commit(marks=marks, expiring=expiring, before_commit=lambda: resolution_failpoints(finished))
        # Committed: the window moves.
        for r in finished:
            self.claimed.pop(r.identity).results.append(r)
            self._count(r.claim, -1)
        for adm in window:
            adm.unresolved = left[id(adm)]
        if entered is not None:
            self.admitted.append(entered)
        for _ in prefix:
            self.admitted.popleft()
        self.offsets.resolve(span)
        for adm in resolving:
            self.steps.account(adm.batch, adm.results)
        if claims:
            self.steps.metrics.inc("claims", len(claims))
            failpoints.hit("after_claim")
        if marks is not None:
            self.offsets_sent(marks)
        if entered is not None:
            for c in claims:
                self.claimed[c.identity] = entered
                self._count(c, 1)
        return claims

    def _count(self, claim: Claim, delta: int) -> None:
        ev = claim.item.event
        if ev is None or not self.count_tenants:
            return
        left = self.tenants[ev.tenant] + delta
        if left > 0:
            self.tenants[ev.tenant] = left
        else:
            del self.tenants[ev.tenant]

    def offsets_sent(self, marks: Marks) -> None:
        self.offsets.t_sent, self.offsets.d_sent = marks.transition, marks.delay
        self.last_offsets = time.monotonic()
        self.steps.metrics.set_gauge("committed_offset", float(marks.transition or 0),
                                     partition=str(self.steps.partition))
        failpoints.hit("after_commit")

    async def _start(self, claims: list[Claim]) -> None:
        """Run the new claims: in this task until a handler first suspends, then as tasks."""
        if not self.steps.concurrent:
            self.finished.extend(await self.steps.execute_all(claims))
            return
        for c in claims:
            task = asyncio.ensure_future(self.steps.execute(c))
            self.tasks.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Resolved]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self.failure is None:
                self.failure = exc
        else:
            self.finished.append(task.result())
        self.progress.set()
        self.notify()

    async def drain(self) -> None:
        """Wait for every execution, then resolve and commit everything, offsets included."""
        while not self.idle:
            if self.failure is None and not self.finished and self.tasks:
                await self.progress.wait()
                continue
            await self.step(None, flush_offsets=True)

    def abandon(self) -> None:
        """The owner failed or was stopped hard: no execution of this window goes on."""
        for task in list(self.tasks):
            task.cancel()
