"""Per-partition claim state, recovered from the compacted state topic, with an outcome horizon.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition to its end under
``read_committed`` (the end is then the last stable offset), so aborted writes of a fenced owner
are never seen and the latest committed snapshot of each identity wins. It streams the partition
in pages (:mod:`streamsched.worker.changelog`), never holding it whole.

Two stores share the interface the turn uses (:class:`StateBase`): :class:`PartitionState`
keeps every snapshot, encoded, in a dict (tests, fakes, ``store_dir=None``), and
:class:`streamsched.worker.claimstore.ClaimStore` keeps them on disk behind a small bounded
cache, with a checkpoint that lets a restart read only the changelog's tail.

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

A record that does not decode as a snapshot is skipped (the identity keeps its previous
snapshot), never silently: :func:`export_corrupt` counts it in ``state_corrupt_records`` and logs
one warning line (the count only, never the bytes).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Protocol

from streamsched.errors import ConfigError, DecodeError
from streamsched.kafka import clients
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.wire.claim import decode_claim, encode_claim

log = logging.getLogger(__name__)

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
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3_600.0, "d": DAY_S}


def parse_duration(text: str) -> float:
    """Seconds in ``"604800"``, ``"90m"``, ``"12h"`` or ``"7d"``."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ConfigError(f"not a duration: {text!r} (use seconds or a number with s, m, h or d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def check_horizon(seconds: float) -> float:
    if not HORIZON_MIN_S <= seconds <= HORIZON_MAX_S:
        raise ConfigError(f"outcome horizon must be between {HORIZON_MIN_S:.0f}s (1 hour) and "
                          f"{HORIZON_MAX_S:.0f}s (365 days), not {seconds:.0f}s")
    return seconds


def scan_interval_ns(horizon_s: float) -> int:
    """Pause between two horizon passes over a partition (1/24 of the horizon, 1 min .. 1 h)."""
    return int(min(3_600.0, max(60.0, horizon_s / 24)) * 1e9)


class Writer(Protocol):
    def add(self, topic: str, value: bytes | None, *, key: bytes | None = None,
            partition: int | None = None, headers: list[tuple[str, bytes]] | None = None) -> None: ...


class StateBase:
    """What the turn needs of a partition's claim state; subclasses store the snapshots."""

    def __init__(self, partition: int, *, horizon_s: float = HORIZON_DEFAULT_S) -> None:
        self.partition = partition
        self.horizon_ns = int(check_horizon(horizon_s) * 1e9)
        self.fence_floor = 0
        self.restored_records = 0
        self.corrupt = 0
        self.corrupt_exported = 0
        """How many of ``corrupt`` :func:`export_corrupt` has already reported."""
        self._staged = 0
        self._staged_at = 0.0
        self._dropping: tuple[list[str], int] | None = None
        self._candidates: list[str] = []
        self._scan_cursor: Any = None
        """Where the current horizon pass goes on (None: no pass running)."""
        self._next_pass_ns = 0
        self._scan_every_ns = scan_interval_ns(horizon_s)

    # --- subclass hooks ---------------------------------------------------------------------------

    def _lookup(self, identity: str) -> ClaimState | None:
        raise NotImplementedError

    def put(self, state: ClaimState, raw: bytes | None = None) -> None:
        """Store ``state``; ``raw``: its encoding, when the caller already has it."""
        raise NotImplementedError

    def _drop(self, identities: list[str], floor: int) -> None:
        raise NotImplementedError

    def _scan_page(self, cursor: Any, cutoff_ns: int) -> tuple[list[str], Any]:
        """Expired identities of the next page after ``cursor`` (None: from the start), and the
        cursor to go on from (None: the pass is complete)."""
        raise NotImplementedError

    def _committed(self, records: int, staged_at: float) -> None:
        """A transaction holding ``records`` state records (0: none) committed."""

    def identities(self) -> int:
        """How many identities the store holds (an estimate for a disk store)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the store holds open (nothing for the in-memory one)."""

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


_NEVER = 2**63
"""Expiry of a snapshot the horizon never removes (claimed, or released without an outcome)."""
DECODED_MAX = 512
"""Most decoded snapshots :class:`PartitionState` keeps beside the encoded ones: enough for the
lookups of a transaction's batches, few enough that the collector hardly notices them."""


def _expiry(st: ClaimState) -> int:
    """When ``st`` was resolved (released with an outcome); :data:`_NEVER` if it is not."""
    out = st.outcome
    return out.at_ns if st.status is ClaimStatus.RELEASED and out is not None else _NEVER


def expired(st: ClaimState, cutoff_ns: int) -> bool:
    """Resolved (released with an outcome) before ``cutoff_ns``."""
    return _expiry(st) < cutoff_ns


class PartitionState(StateBase):
    """Latest snapshot per identity for one partition, in memory (``store_dir=None``, tests).

    Each snapshot is kept as its state-topic bytes with its expiry time, a tuple of values
    CPython's cycle collector stops tracking, so the collector never walks the state: kept as
    :class:`ClaimState` objects, full collections took 25-90 ms each in a half-load latency run
    (42,000 to 140,000 tracked objects, growing with the identities seen, so without bound until
    the outcome horizon). Decoding costs about 13 us, so up to :data:`DECODED_MAX` decoded
    snapshots (the latest put or looked up) are kept too; the turn's lookups of new identities
    are dict misses.
    """

    def __init__(self, partition: int, *, horizon_s: float = HORIZON_DEFAULT_S) -> None:
        super().__init__(partition, horizon_s=horizon_s)
        self._encoded: dict[str, tuple[bytes, int]] = {}
        self._decoded: dict[str, ClaimState] = {}

    def _remember(self, identity: str, st: ClaimState) -> None:
        if len(self._decoded) >= DECODED_MAX:
            self._decoded.clear()  # cheaper than LRU bookkeeping on every lookup
        self._decoded[identity] = st

    def _lookup(self, identity: str) -> ClaimState | None:
        st = self._decoded.get(identity)
        if st is not None:
            return st
        entry = self._encoded.get(identity)
        if entry is None:
            return None
        st = decode_claim(entry[0])
        self._remember(identity, st)
        return st

    def put(self, state: ClaimState, raw: bytes | None = None) -> None:
        self._encoded[state.identity] = (raw if raw is not None else encode_claim(state), _expiry(state))
        self._remember(state.identity, state)

    def identities(self) -> int:
        return len(self._encoded)

    def _drop(self, identities: list[str], floor: int) -> None:
        for identity in identities:
            self._encoded.pop(identity, None)
            self._decoded.pop(identity, None)

    def _scan_page(self, cursor: Any, cutoff_ns: int) -> tuple[list[str], Any]:
        # In memory a whole pass is one page (expiry times kept beside the bytes: no decoding),
        # bounded like a disk store's candidates; what it leaves is found by the next pass.
        found = []
        for identity, (_, expires) in self._encoded.items():
            if expires < cutoff_ns:
                found.append(identity)
                if len(found) >= CANDIDATES_MAX:
                    break
        return found, None

    def apply_record(self, value: bytes | None, key: bytes | None) -> None:
        if value is None:
            if key is not None:
                self._drop([key.decode("ascii", "replace")], self.fence_floor)
            return
        self.restored_records += 1
        try:
            st = decode_claim(value)
        except (DecodeError, KeyError, ValueError):
            # Only streamsched writes here; count it and keep the previous snapshot.
            self.corrupt += 1
            return
        if st.identity == FLOOR_IDENTITY:
            self.fence_floor = max(self.fence_floor, st.fence)
        else:
            self.put(st, value if isinstance(value, bytes) else None)


def export_corrupt(state: StateBase, metrics: Metrics) -> int:
    """Report corrupt records not reported yet (metric + one warning line); returns how many."""
    new = state.corrupt - state.corrupt_exported
    if new <= 0:
        return 0
    state.corrupt_exported = state.corrupt
    metrics.inc("state_corrupt_records", new, partition=str(state.partition))
    log.warning("state partition %d: %d corrupt record(s) skipped during restore; the affected "
                "identities keep their previous snapshot", state.partition, new)
    return new


class Progress:
    """Restore progress of one partition: ``restore_records``/``restore_remaining`` metrics and
    a log line every few seconds (offsets and counts only)."""

    def __init__(self, metrics: Metrics | None, topic: str, partition: int, start: int, end: int,
                 kind: str) -> None:
        self.metrics, self.topic, self.partition = metrics, topic, partition
        self.start, self.end, self.kind = start, end, kind
        self.records = 0
        self.t0 = self._last_log = time.monotonic()
        if metrics is not None:
            metrics.inc("restores", kind=kind)
            metrics.set_gauge("restore_remaining", max(0, end - start), partition=str(partition))

    def page(self, records: int, position: int) -> None:
        self.records += records
        if self.metrics is not None:
            self.metrics.inc("restore_records", records, partition=str(self.partition))
            self.metrics.set_gauge("restore_remaining", max(0, self.end - position),
                                   partition=str(self.partition))
        now = time.monotonic()
        if now - self._last_log >= 5.0:
            self._last_log = now
            done = (position - self.start) / max(1, self.end - self.start)
            log.info("restoring %s[%d] (%s): offset %d of %d (%.0f%%), %d records in %.1fs", self.topic,
                     self.partition, self.kind, position, self.end, 100 * done, self.records, now - self.t0)

    def done(self) -> float:
        elapsed = time.monotonic() - self.t0
        if self.metrics is not None:
            self.metrics.observe("restore_seconds", elapsed, partition=str(self.partition))
            self.metrics.set_gauge("restore_remaining", 0, partition=str(self.partition))
        log.info("restored %s[%d] (%s) from offset %d to %d: %d records in %.2fs", self.topic,
                 self.partition, self.kind, self.start, self.end, self.records, elapsed)
        return elapsed


async def restore(conn: clients.Conn, topic: str, partition: int, *, horizon_s: float = HORIZON_DEFAULT_S,
                  metrics: Metrics | None = None, timeout_s: float = 60.0) -> PartitionState:
    """Read ``topic[partition]`` to its end, a page at a time, into a :class:`PartitionState`
    (``timeout_s``: the longest the read may stall without progress)."""
    from streamsched.kafka.changelog import PartitionReader

    state = PartitionState(partition, horizon_s=horizon_s)
    async with PartitionReader(conn, topic, partition, stall_s=timeout_s) as reader:
        bounds = await reader.bounds()
        progress = Progress(metrics, topic, partition, bounds.begin, bounds.end, "memory")
        async for records, position in reader.pages(bounds.begin, bounds.end):
            for rec in records:
                state.apply_record(rec.value, rec.key)
            progress.page(len(records), position)
        progress.done()
    return state


async def open_state(conn: clients.Conn, topic: str, partition: int, *, env: Any = None,
                     horizon_s: float = HORIZON_DEFAULT_S, metrics: Metrics | None = None,
                     stall_s: float = 60.0) -> StateBase:
    """The caught-up state of ``topic[partition]``: on disk under ``env`` (a
    :class:`~streamsched.worker.rocksenv.StoreEnv`), else in memory."""
    if env is None:
        return await restore(conn, topic, partition, horizon_s=horizon_s, metrics=metrics, timeout_s=stall_s)
    from streamsched.worker.claimstore import open_store

    return await open_store(env, conn, topic, partition, horizon_s=horizon_s, metrics=metrics,
                            stall_s=stall_s)
