"""The claim state's abstract base: what the turn needs of a partition's claim state, and the
outcome horizon and fence floor every store enforces the same way.

Two stores implement :class:`StateBase`, each in its own module:
:class:`streamsched.worker.store.PartitionState` keeps every snapshot in memory (tests, fakes,
``store_dir=None``), :class:`streamsched.worker.claimstore.ClaimStore` keeps them on disk. The
rules that must not differ between them live here, once, so the disk store needs nothing of the
in-memory store's module (which imports it only to choose between the two, in ``open_state``).

**Outcome horizon.** A resolved identity (RELEASED with an outcome) is kept for
``horizon_s`` after its outcome (default 7 days, bounds 1 hour .. 365 days). Past it, the worker
writes a tombstone (key = identity, null value) in one of its transactions and drops the entry,
so state stops growing with every identity ever seen. Consequence: an event replayed after its
identity's horizon is a new delivery and RUNS AGAIN; an external destination's idempotency key
(``CommandContext.idempotency_key``) is then the last guard. Its fence still continues: every
transaction that tombstones also writes the partition's *fence floor* (a snapshot under the
reserved identity :data:`FLOOR_IDENTITY` carrying the highest fence tombstoned so far), and a
claim on an identity the store does not hold starts from that floor, so a fence is never minted
twice for one identity, across restarts and cold restores alike. Identities released without an
outcome (a retry is parked) and claimed ones are never tombstoned.

Checkpoint bookkeeping the turn drives: :meth:`StateBase.stage` for every record it writes to
the state partition inside a transaction, :meth:`StateBase.commit_staged` after that transaction
committed (and its snapshots were ``put``), :meth:`StateBase.discard_staged` after an abort.
Tombstones are applied to the store only by ``commit_staged``: an aborted transaction leaves the
store as the changelog has it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Protocol

from streamsched.errors import ConfigError, StreamschedError
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.wire.claim import encode_claim

DAY_S = 86_400.0
HORIZON_DEFAULT_S = 7 * DAY_S
HORIZON_MIN_S = 3_600.0
HORIZON_MAX_S = 365 * DAY_S
FLOOR_IDENTITY = "~fence-floor"
"""Reserved identity of the partition's fence floor snapshot (business identities are ``sched_<hex>``)."""
FLOOR_KEY = FLOOR_IDENTITY.encode()
EXPIRE_BATCH = 256
"""Most tombstones one transaction writes."""
CANDIDATES_MAX = 4 * EXPIRE_BATCH
"""Expired identities held at most between a scan and their tombstones (the pass waits past it)."""
NEVER = 2**63
"""Expiry of a snapshot the horizon never removes (claimed, or released without an outcome)."""


def check_horizon(seconds: float) -> float:
    if not HORIZON_MIN_S <= seconds <= HORIZON_MAX_S:
        raise ConfigError(f"outcome horizon must be between {HORIZON_MIN_S:.0f}s (1 hour) and "
                          f"{HORIZON_MAX_S:.0f}s (365 days), not {seconds:.0f}s")
    return seconds


def scan_interval_ns(horizon_s: float) -> int:
    """Pause between two horizon passes over a partition (1/24 of the horizon, 1 min .. 1 h)."""
    return int(min(3_600.0, max(60.0, horizon_s / 24)) * 1e9)


def expiry(st: ClaimState) -> int:
    """When ``st`` was resolved (released with an outcome); :data:`NEVER` if it is not."""
    out = st.outcome
    return out.at_ns if st.status is ClaimStatus.RELEASED and out is not None else NEVER


def expired(st: ClaimState, cutoff_ns: int) -> bool:
    """Resolved (released with an outcome) before ``cutoff_ns``."""
    return expiry(st) < cutoff_ns


class Writer(Protocol):
    def add(self, topic: str, value: bytes | None, *, key: bytes | None = None,
            partition: int | None = None, headers: list[tuple[str, bytes]] | None = None) -> None: ...


class StateBase(ABC):
    """What the turn needs of a partition's claim state; subclasses store the snapshots.

    The turn's interface (``get``, the staging calls, the horizon pass and ``expire``) is written
    once here over the storage primitives each store implements: :meth:`_lookup`, :meth:`put`,
    :meth:`_drop`, :meth:`_scan_page`, :meth:`identities`, :meth:`_committed` and :meth:`close`."""

    def __init__(self, partition: int, *, horizon_s: float = HORIZON_DEFAULT_S) -> None:
        self.partition = partition
        self.horizon_ns = int(check_horizon(horizon_s) * 1e9)
        self.fence_floor = 0
        self.restored_records = 0
        self.corrupt = 0
        self.corrupt_exported = 0
        """How many of ``corrupt`` :func:`~streamsched.worker.store.export_corrupt` has already reported."""
        self.broken: StreamschedError | None = None
        """Set when the store can no longer persist what it is given (a disk store whose
        filesystem refuses writes): it still answers from memory, and the partition stops
        cleanly (resolves what it has in hand), then fails with this error (partition.py)."""
        self._staged = 0
        self._staged_at = 0.0
        self._dropping: tuple[list[str], int] | None = None
        self._candidates: list[str] = []
        self._scan_cursor: Any = None
        """Where the current horizon pass goes on (None: no pass running)."""
        self._next_pass_ns = 0
        self._scan_every_ns = scan_interval_ns(horizon_s)

    # --- what each store implements ----------------------------------------------------------------

    @abstractmethod
    def _lookup(self, identity: str) -> ClaimState | None:
        """The stored snapshot of ``identity`` (None: none stored; the fence floor is not applied)."""

    @abstractmethod
    def put(self, state: ClaimState, raw: bytes | None = None) -> None:
        """Store ``state``; ``raw``: its encoding, when the caller already has it."""

    @abstractmethod
    def _drop(self, identities: list[str], floor: int) -> None:
        """Remove ``identities``, their tombstones committed; ``floor``: the partition's fence
        floor with them, for a store that persists it (the base keeps :attr:`fence_floor`)."""

    @abstractmethod
    def _scan_page(self, cursor: Any, cutoff_ns: int) -> tuple[list[str], Any]:
        """Expired identities of the next page after ``cursor`` (None: from the start), and the
        cursor to go on from (None: the pass is complete)."""

    @abstractmethod
    def identities(self) -> int:
        """How many identities the store holds (an estimate for a disk store)."""

    @abstractmethod
    def _committed(self, records: int, staged_at: float) -> None:
        """A transaction holding ``records`` state records (0: none) committed, its first record
        staged at ``staged_at`` (wall clock): where a store moves its checkpoint."""

    @abstractmethod
    def close(self) -> None:
        """Release what the store holds open."""

    # --- the turn's interface ---------------------------------------------------------------------

    def get(self, identity: str) -> ClaimState:
        state = self._lookup(identity)
        if state is not None:
            return state
        return ClaimState(identity, fence=self.fence_floor) if self.fence_floor else ClaimState(identity)

    def stage(self, records: int = 1) -> None:
        """``records`` more records for the state partition in the open transaction."""
        if not self._staged:
            self._staged_at = time.time()  # before the commit: bounds when the next records were written
        self._staged += records

    def commit_staged(self) -> None:
        """The open transaction committed and its snapshots were ``put``: apply its tombstones,
        and let the store move its checkpoint past the transaction."""
        if self._dropping is not None:
            identities, floor = self._dropping
            self._drop(identities, floor)
            self.fence_floor = max(self.fence_floor, floor)
        self._committed(self._staged, self._staged_at)
        self._staged, self._dropping = 0, None

    def discard_staged(self) -> None:
        """The open transaction aborted: nothing of it counts."""
        self._staged, self._dropping = 0, None

    @property
    def has_expired(self) -> bool:
        """Identities past the horizon are waiting for their tombstones."""
        return bool(self._candidates)

    def scan(self, now_ns: int) -> bool:
        """One page of the horizon pass if one is running or due; True if tombstones wait."""
        idle = self._scan_cursor is None and now_ns < self._next_pass_ns
        if idle or len(self._candidates) >= CANDIDATES_MAX:
            return bool(self._candidates)
        found, self._scan_cursor = self._scan_page(self._scan_cursor, now_ns - self.horizon_ns)
        self._candidates.extend(found)
        if self._scan_cursor is None:
            self._next_pass_ns = now_ns + self._scan_every_ns
        return bool(self._candidates)

    def take_expired(self, now_ns: int) -> list[ClaimState]:
        """Up to :data:`EXPIRE_BATCH` snapshots past the horizon *now* (re-checked: a candidate
        claimed again since the scan is not one any more)."""
        self.scan(now_ns)
        if not self._candidates:
            return []
        taken, self._candidates = self._candidates[:EXPIRE_BATCH], self._candidates[EXPIRE_BATCH:]
        cutoff = now_ns - self.horizon_ns
        out = []
        for identity in taken:
            st = self._lookup(identity)
            if st is not None and expired(st, cutoff):
                out.append(st)
        return out

    def expire(self, writer: Writer, topic: str, states: list[ClaimState], skip: dict[str, Any]) -> None:
        """Write tombstones for ``states`` (not those in ``skip``: this transaction writes them)
        and the raised fence floor into the open transaction; applied by :meth:`commit_staged`."""
        floor, dropped = self.fence_floor, []
        for st in states:
            if st.identity in skip:
                continue
            writer.add(topic, None, key=st.identity.encode(), partition=self.partition)
            dropped.append(st.identity)
            floor = max(floor, st.fence)
        if not dropped:
            return
        self.stage(len(dropped))
        if floor > self.fence_floor:
            writer.add(topic, encode_claim(ClaimState(FLOOR_IDENTITY, fence=floor)), key=FLOOR_KEY,
                       partition=self.partition)
            self.stage()
        self._dropping = (dropped, floor)
