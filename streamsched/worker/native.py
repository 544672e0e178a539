"""The Kafka-native shape: effects that are events commit with their outcome, release and offset.

When every command of a scheduler is a :class:`~streamsched.worker.app.KafkaCommand`, the effect
*is* the emitted events, which commit atomically with the outcome, the release and the offset,
so nothing needs a claim committed before it runs. The claim is taken in memory (through the
same state machine, fence+1 and ordinal+1), the batch executes and resolves, and ONE snapshot per
item (RELEASED, with its outcome) goes into a :class:`~streamsched.worker.checkpoint.Checkpoint`
assembled in memory. Several batches of at most ``max_in_flight`` items (executed one batch at a
time: the in-flight bound is unchanged) share that checkpoint, committed when
``commit_interval_s`` has passed since its first batch (like Kafka Streams' exactly-once commit
interval), when it grows past :data:`TXN_MAX_RECORDS`/:data:`TXN_MAX_BYTES`, or as soon as the
partition has nothing more in hand (so latency is paid only under load).

Its consumed offsets ride along only every ``commit_interval_s`` (and always when it holds a
dead letter, a forwarded or a parked record, and when the partition drains): a committed offset
may lag resolved work, never lead it, and a record re-read after a crash finds its identity's
outcome stored and is skipped. Two of a transaction's four round trips are the offsets'
(AddOffsetsToTxn, TxnOffsetCommit): leaving them out of most transactions halves half-load
latency. The transaction is begun and written only at its commit: it is never open while a
handler runs, so a slow handler cannot outlive the producer's transaction timeout. A crash before
the commit loses the whole transaction and nothing of it was ever visible (read_committed); the
next owner re-reads the records from the committed offset and runs them again. A fence minted in
the lost transaction may then be minted again: nothing ever carried it outside that transaction
(a Kafka-native command has no external effect), and every committed snapshot still shows
fences increasing per identity.

Delivery counting. A Kafka-native claim that never commits is not counted, so a handler that
kills its worker would crash-loop forever. Hence the shape starts *careful*: the first batch
after every (re)start that executes anything (a leader whose identity holds no outcome) goes
through the claim-first window (durable claims, then its own release + offset transaction). Each
crash then either counts a delivery of the first unresolved items after the committed offset or
the committed offset has moved past them, and ``MAX_DELIVERY_ATTEMPTS`` ends the loop. Batches
before it, re-read because offsets lag, hold only resolved identities and execute nothing.
"""

from __future__ import annotations

import time

from streamsched import failpoints
from streamsched.model.claims import ClaimState
from streamsched.worker.checkpoint import Checkpoint, Marks, TxnSettings
from streamsched.worker.offsets import Offsets, Span
from streamsched.worker.selection import Batch
from streamsched.worker.steps import PartitionSteps, Resolved, resolution_failpoints, writes_side_records
from streamsched.worker.window import ClaimWindow

TXN_MAX_RECORDS = 4096
"""A Kafka-native transaction commits once it holds this many records (besides the interval)."""
TXN_MAX_BYTES = 1024 * 1024
"""...or about this many bytes of record values (the producer's batch size)."""


class KafkaNative:
    """Kafka-native turns of one partition: batches gathered into one checkpoint until it is due."""

    def __init__(self, steps: PartitionSteps, txn: TxnSettings, offsets: Offsets, *,
                 careful: ClaimWindow, commit_interval_s: float) -> None:
        self.steps = steps
        self.txn = txn
        self.offsets = offsets
        self.commit_interval_s = commit_interval_s
        self.careful: ClaimWindow | None = careful
        """The claim-first window the first executing batch after a start goes through (module
        docs); None once it has."""
        self.open: Checkpoint | None = None
        self.batches: list[tuple[Batch, list[Resolved]]] = []
        """The batches resolved into the open checkpoint, with their leaders' results."""
        self.last_offsets = time.monotonic()

    def current(self, identity: str) -> ClaimState:
        """``identity``'s state as the open checkpoint leaves it, else as committed."""
        return self.open.current(identity) if self.open is not None else self.txn.state.get(identity)

    @property
    def idle(self) -> bool:
        return self.open is None and not self.offsets.unsent()

    def due(self) -> bool:
        cp = self.open
        return cp is not None and (cp.age_s() >= self.commit_interval_s
                                   or len(cp) >= TXN_MAX_RECORDS or cp.bytes >= TXN_MAX_BYTES)

    def flush_wait_s(self) -> float:
        """With nothing in hand: how long a flush may wait because all it would commit is offsets
        that are not due yet (0: flush now)."""
        if self.open is not None or not self.offsets.unsent():
            return 0.0
        return max(0.0, self.commit_interval_s - (time.monotonic() - self.last_offsets))

    async def step(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        if incoming is not None:
            careful = self.careful
            if careful is not None and any(self.current(it.identity).outcome is None
                                           for it in incoming.leaders):
                # The first batch after a start that executes anything claims first. (A batch
                # whose identities all hold outcomes, re-read behind a lagging offset, executes
                # nothing: it needs no durable claim and keeps the shape careful.)
                await self.commit()  # whatever was gathered commits first, in order
                self.careful = None
                await careful.step(incoming)
                await careful.drain()  # its release and offset commit on their own
                self.last_offsets = careful.last_offsets
                return
            await self.gather(incoming)
        if flush_offsets or self.due():
            await self.commit()

    async def gather(self, batch: Batch) -> None:
        """Claim in memory, execute, resolve: ``batch``'s records join the open checkpoint."""
        cp = self.open
        if cp is None:
            cp = self.open = Checkpoint(self.txn)
        steps = self.steps
        try:
            results: list[Resolved] = []
            if batch.leaders:
                claims = steps.acquire(batch.leaders, cp)
                steps.metrics.inc("claims", len(claims))
                failpoints.hit("after_claim")
                results = await steps.execute_all(claims)
                # No transaction is open on the producer: the admin lookup may happen here.
                await steps.resolve_feedback(results)
            before = len(cp)
            steps.write_resolution(results, cp)
            steps.write_others(batch.others(), cp)
            # Emits, and the original record of a dead letter, a parked or a forwarded item.
            written = 0
            for r in results:
                ex = r.execution
                for e in ex.emits:
                    written += len(e.value)
                if ex.dead is not None or ex.park_until_ns is not None:
                    written += len(r.claim.item.record.value or b"")
            for it in batch.items:
                if it.dead is not None or it.forward is not None or it.park_until_ns is not None:
                    written += len(it.record.value or b"")
            cp.count(len(cp) - before, written)
        except BaseException:
            # Nothing was sent; the runner fails and the next owner starts from committed state.
            self.open = None
            self.batches = []
            cp.discard()
            raise
        self.batches.append((batch, results))

    async def commit(self, *, offsets_now: bool = False) -> None:
        """Commit the open checkpoint with the offsets it resolves (and whatever offsets or
        tombstones are due, even if it gathered nothing); ``offsets_now``: offsets ride along
        whether due or not (the partition drains)."""
        cp, self.open = self.open, None
        batches, self.batches = self.batches, []
        span = Span(max((b.next_offset for b, _ in batches if b.next_offset is not None), default=None),
                    [o for b, _ in batches for o in b.delayed])
        t_mark, d_mark = self.offsets.after(span)
        changed = t_mark != self.offsets.t_sent or d_mark != self.offsets.d_sent
        # The interval first: under load it is usually due, and then no item needs a look.
        send = changed and (offsets_now or not batches
                            or time.monotonic() - self.last_offsets >= self.commit_interval_s
                            or writes_side_records(batches))
        expiring = self.txn.state.take_expired(self.steps.clock())  # past the outcome horizon
        if not batches and not send and not expiring:
            return
        if cp is None:
            cp = Checkpoint(self.txn)
        if not send and not expiring and not len(cp):
            # Nothing to write (records outside the selection): no transaction; the offsets
            # follow with a later one.
            self._resolved(batches, span)
            return
        await cp.commit(marks=Marks(t_mark, d_mark) if send else None, expiring=expiring,
                        before_commit=lambda: resolution_failpoints(r for _, rs in batches for r in rs))
        self._resolved(batches, span)
        if send:
            self.offsets.t_sent, self.offsets.d_sent = t_mark, d_mark
            self.last_offsets = time.monotonic()
            self.steps.metrics.set_gauge("committed_offset", float(t_mark or 0),
                                         partition=str(self.steps.partition))
            failpoints.hit("after_commit")

    def _resolved(self, batches: list[tuple[Batch, list[Resolved]]], span: Span) -> None:
        self.offsets.resolve(span)
        for b, results in batches:
            self.steps.account(b, results)

    async def drain(self) -> None:
        """Commit everything in hand, offsets included (clean revocation and shutdown)."""
        while not self.idle:
            await self.commit(offsets_now=True)
