"""One partition's transaction while it is assembled: what it writes, the claim snapshots it
leaves behind, and when it is due.

Both transaction shapes of the turn (:mod:`streamsched.worker.window`,
:mod:`streamsched.worker.native`) write through a :class:`Checkpoint`, so the order that makes a
crash at any failpoint safe lives here once:

* nothing is sent before :meth:`Checkpoint.commit`: records are buffered in a
  :class:`~streamsched.kafka.writer.GroupedWriter`, claim snapshots in :attr:`Checkpoint.view`
  (what each identity's state will be once the transaction commits);
* the claim store learns a snapshot only after its transaction committed (``state.put`` after
  ``commit_transaction``), and forgets everything staged when it aborts, so the store never
  holds a state that Kafka does not;
* consumed offsets, when sent, travel inside the same transaction as the state they cover: an
  offset is never visible before that state (read_committed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streamsched.kafka.protocols import TransactionalProducer
from streamsched.kafka.txn import transaction
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import encode_claim
from streamsched.worker.statebase import StateBase

RECORD_OVERHEAD = 64
"""Bytes counted per record on top of its value (key, headers, framing) against a size bound."""


@dataclass(frozen=True, slots=True)
class Marks:
    """Consumed offsets a transaction commits: the next transition and delay offsets to read
    (None: that partition has nothing to commit)."""

    transition: int | None
    delay: int | None


@dataclass(slots=True)
class TxnSettings:
    """What every transaction of one partition shares (owned by its turn runner)."""

    producer: TransactionalProducer
    state: StateBase
    state_topic: str
    partition: int
    metrics: Metrics
    deadline_s: float
    send_offsets: Callable[[Marks], Awaitable[None]]


class Checkpoint:
    """A transaction being assembled in memory; :meth:`commit` sends and commits it."""

    __slots__ = ("_encoded", "_read", "_settings", "bytes", "started", "view", "writer")

    def __init__(self, settings: TxnSettings) -> None:
        self._settings = settings
        self.writer = GroupedWriter(settings.producer)
        self.view: dict[str, ClaimState] = {}
        """The snapshot each identity will have once this transaction commits."""
        self._encoded: dict[str, tuple[ClaimState, bytes]] = {}
        self._read: dict[str, ClaimState] = {}
        """Committed states already looked up through :meth:`current`. The partition's committed
        state changes only when a transaction of its own commits, and this one is the only one
        assembled until it commits: a lookup stays true while it is open (selection and claim
        ask for the same identity; with the disk store each ask reads RocksDB)."""
        self.started = time.monotonic()
        self.bytes = 0
        """Estimated bytes of the records written so far (see :meth:`count`)."""

    def __len__(self) -> int:
        return len(self.writer)

    def current(self, identity: str) -> ClaimState:
        """``identity``'s state as this transaction leaves it (else as committed)."""
        st = self.view.get(identity)
        if st is None:
            st = self._read.get(identity)
            if st is None:
                st = self._read[identity] = self._settings.state.get(identity)
        return st

    def put(self, st: ClaimState) -> None:
        """Write a claim snapshot to the state topic (and remember its bytes for the store)."""
        s = self._settings
        self.view[st.identity] = st
        key = st.identity.encode()
        raw = encode_claim(st, key)
        self._encoded[st.identity] = (st, raw)
        self.writer.add(s.state_topic, raw, key=key, partition=s.partition)
        s.state.stage()

    def count(self, records: int, value_bytes: int) -> None:
        """Account ``records`` written with ``value_bytes`` of values against the size bound."""
        self.bytes += records * RECORD_OVERHEAD + value_bytes

    def age_s(self) -> float:
        return time.monotonic() - self.started

    async def commit(self, *, marks: Marks | None, expiring: list[ClaimState],
                     before_commit: Callable[[], None] = lambda: None) -> None:
        """Send everything, with ``marks`` (offsets) and ``expiring`` tombstones, in one
        transaction; then the committed snapshots become the partition's state.

        ``before_commit`` runs once the records are acknowledged and before the commit (the
        crash matrix's failpoints between a resolution's writes and its commit).
        """
        s = self._settings

        async def body() -> None:
            if expiring:
                s.state.expire(self.writer, s.state_topic, expiring, skip=self.view)
            if marks is not None:
                # The offsets' two requests overlap the records' produce request (one round trip
                # of the commit saved); both are acknowledged before the commit.
                await _both(self.writer.flush(), s.send_offsets(marks))
            else:
                await self.writer.flush()
            before_commit()

        await transaction(s.producer, body, deadline_s=s.deadline_s, on_abort=self.discard,
                          metrics=s.metrics, what=f"a transaction of partition {s.partition}")
        encoded = self._encoded
        for identity, st in self.view.items():
            enc = encoded.get(identity)
            # A disk store keeps the bytes already encoded for the state topic.
            s.state.put(st, enc[1] if enc is not None and enc[0] is st else None)
        encoded.clear()
        s.state.commit_staged()  # tombstones applied, checkpoint moved (claimstore.py)

    def discard(self) -> None:
        """Forget what was staged: nothing of this transaction is visible (or ever will be)."""
        self._encoded.clear()
        self._settings.state.discard_staged()


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    """Await both concurrently; raise the first failure only once both are done (so no
    failure is left unretrieved and nothing is still running when the caller aborts)."""
    results = await asyncio.gather(first, second, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
