"""Per-partition claim state, recovered from the compacted state topic: the in-memory store, and
the choice between it and the disk store.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition to its end under
``read_committed`` (the end is then the last stable offset), so aborted writes of a fenced owner
are never seen and the latest committed snapshot of each identity wins. It streams the partition
in pages (:mod:`streamsched.kafka.changelog`), never holding it whole.

Two stores implement the interface the turn uses, :class:`~streamsched.worker.statebase.StateBase`
(where the outcome horizon and the fence floor are defined): :class:`PartitionState` here keeps
every snapshot, encoded, in a dict (tests, fakes, ``store_dir=None``), and
:class:`streamsched.worker.claimstore.ClaimStore` keeps them on disk behind a small bounded
cache, with a checkpoint that lets a restart read only the changelog's tail. :func:`open_state`
picks one; the disk store never imports this module.

A record that does not decode as a snapshot is skipped (the identity keeps its previous
snapshot), never silently: :func:`export_corrupt` counts it in ``state_corrupt_records`` and logs
one warning line (the count only, never the bytes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from streamsched.errors import DecodeError
from streamsched.kafka import clients
from streamsched.kafka.changelog import PartitionReader, ReaderPool, replay
from streamsched.kafka.progress import Progress
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import decode_claim, encode_claim
from streamsched.worker.claimstore import ClaimStore
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.statebase import (
    CANDIDATES_MAX,
    FLOOR_IDENTITY,
    HORIZON_DEFAULT_S,
    StateBase,
    expiry,
)
from streamsched.worker.storefaults import unwritable

log = logging.getLogger(__name__)

BULK_MIN_RECORDS = 10_000
"""A cold restore of at least this many offsets loads its store in bulk mode (see ClaimStore):
a bulk open ends with a flush and a second open, which a small restore does not win back
(1,024 restores of a few records each, on one worker: the second open was most of their time)."""
DECODED_MAX = 512
"""Most decoded snapshots :class:`PartitionState` keeps beside the encoded ones: enough for the
lookups of a transaction's batches, few enough that the collector hardly notices them."""


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
        self._encoded[state.identity] = (raw if raw is not None else encode_claim(state), expiry(state))
        self._remember(state.identity, state)

    def identities(self) -> int:
        return len(self._encoded)

    def _committed(self, records: int, staged_at: float) -> None:
        return None  # no checkpoint: memory is rebuilt from the changelog, from its start

    def close(self) -> None:
        return None  # nothing held open

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


async def restore(conn: clients.Conn, topic: str, partition: int, *, horizon_s: float = HORIZON_DEFAULT_S,
                  metrics: Metrics | None = None, timeout_s: float = 60.0,
                  min_end: int = 0, pool: ReaderPool | None = None) -> PartitionState:
    """Read ``topic[partition]`` to its end, a page at a time, into a :class:`PartitionState`
    (``timeout_s``: the longest the read may stall without progress). An end before ``min_end``
    (a read barrier's, :func:`streamsched.kafka.txn.read_barrier`) raises :class:`ChangelogBehind`.
    ``pool``: the worker's restore consumers (else one of its own)."""
    state = PartitionState(partition, horizon_s=horizon_s)

    def apply(records: list[ConsumerRecord]) -> None:
        for rec in records:
            state.apply_record(rec.value, rec.key)

    await replay(conn, topic, partition, apply, kind="memory", metrics=metrics, stall_s=timeout_s,
                 min_end=min_end, pool=pool)
    return state


async def open_state(conn: clients.Conn, topic: str, partition: int, *, env: Any = None,
                     horizon_s: float = HORIZON_DEFAULT_S, metrics: Metrics | None = None,
                     stall_s: float = 60.0, min_end: int = 0, pool: ReaderPool | None = None) -> StateBase:
    """The caught-up state of ``topic[partition]``: on disk under ``env`` (a
    :class:`~streamsched.worker.rocksenv.StoreEnv`), else in memory; ``min_end`` and ``pool`` as
    in :func:`restore`."""
    if env is None:
        return await restore(conn, topic, partition, horizon_s=horizon_s, metrics=metrics, timeout_s=stall_s,
                             min_end=min_end, pool=pool)
    return await open_store(env, conn, topic, partition, horizon_s=horizon_s, metrics=metrics,
                            stall_s=stall_s, min_end=min_end, pool=pool)


async def open_store(env: StoreEnv, conn: clients.Conn, topic: str, partition: int, *,
                     horizon_s: float = HORIZON_DEFAULT_S, metrics: Metrics | None = None,
                     stall_s: float = 60.0, min_end: int = 0, pool: ReaderPool | None = None) -> ClaimStore:
    """The store of ``topic[partition]`` caught up to the partition's end (read_committed): warm
    from its checkpoint if it is trusted, else wiped and restored cold (module docs). An end
    before ``min_end``, or before the store's own checkpoint, is a stale leader's: it raises
    :class:`ChangelogBehind`. The RocksDB work (open, wipe) runs while no restore consumer is
    held: a pooled consumer is lent for the bounds, then for the records (without ``pool``, a
    pool of one consumer for this restore alone)."""
    if pool is None:
        own = ReaderPool(conn, 1)
        try:
            return await open_store(env, conn, topic, partition, horizon_s=horizon_s, metrics=metrics,
                                    stall_s=stall_s, min_end=min_end, pool=own)
        finally:
            await own.close()
    ident = await env.identity(conn, topic)
    store = ClaimStore(env, topic, partition, horizon_s=horizon_s, metrics=metrics)
    try:
        existing = await store.in_thread(store.open_existing)
        reader = PartitionReader(conn, topic, partition, stall_s=stall_s, pool=pool)
        bounds = await reader.bounds(min_end=min_end)  # asked with other restores, nothing held
        reason: str | None = "no local store"
        if existing:
            reason = store.distrust(ident, bounds, int(time.time() * 1000))
        checkpoint = store.read_checkpoint() if reason is None else None
        if reason is None and checkpoint is not None:
            kind, start = "warm", checkpoint[0]
        else:
            # A store that exists but is not trusted costs a full restore: worth a warning.
            log.log(logging.INFO if reason == "no local store" else logging.WARNING,
                    "claim store of %s[%d]: %s; restoring cold", topic, partition, reason)
            kind, start = "cold", bounds.begin
            await store.in_thread(lambda: store.wipe(ident, bulk=bounds.end - start >= BULK_MIN_RECORDS))
        progress = Progress(metrics, topic, partition, start, bounds.end, kind)
        if start < bounds.end:
            async with reader:
                await store.catch_up(reader, start, bounds.end, progress)
        else:
            await store.catch_up(reader, start, bounds.end, progress)  # reads nothing: not entered
        progress.done()
    except Exception as exc:
        store.close()
        if unwritable(exc) is None:
            raise
        raise store.failed(exc) from None
    except BaseException:
        store.close()
        raise
    if (topic, partition) in env.unwritable:
        env.unwritable.discard((topic, partition))
        if metrics is not None:
            metrics.set_gauge("store_unwritable", 0, partition=str(partition))
        log.info("claim store of %s[%d] is written again", topic, partition)
    return store
