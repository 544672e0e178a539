"""A disk-backed claim store per partition, fed by the compacted state topic as its changelog.

The storage engine and its tuning, and why RocksDB: :mod:`streamsched.worker.rocksenv`.

Layout: ``<store_dir>/<state topic>/<partition>/``, one RocksDB per owned partition; the keys are
the identities and the values the changelog's record values, as they are (a restore does not
decode them: decoding happens once per identity a turn touches). Two reserved keys hold what
makes the data trustworthy, written in the same atomic batch as the data they describe:

* ``\\x00header``: format, topic, partition, cluster id and topic id of the log it reflects;
* ``\\x00checkpoint``: the changelog offset C it reflects (every committed record below C is
  applied) and a wall-clock time T before which every record at or after C was written.

**Trust.** A store is used warm (read from C to the end) only if its header names this cluster
and this incarnation of the topic, C lies within ``[low watermark, end]``, and T is younger than
the topic's ``delete.retention.ms`` less a margin. That last rule is what makes a store left by
an earlier owner generation safe: everything any later owner committed is in the changelog's
tail and replayed, except tombstones, which compaction may purge once ``delete.retention.ms``
has passed; a store older than that could resurrect a tombstoned identity, so it is wiped. Any
other case (no store, a store of another cluster or topic incarnation) wipes it and restores
cold, from the low watermark, in pages. C past the end of this very incarnation is not a reason
to restore: Kafka does not take committed records back, so the end was read from a stale leader
(a broker cut off from the cluster serving its old log), and a restore to it would forget the
outcomes past it. The restore fails with ``ChangelogBehind`` and the owner reads again after its
restart. A store another process holds open (its RocksDB lock) is never waited for:
this owner restores cold into a private directory, removed when it closes.

**Checkpoints while running.** The owner is the partition's only writer, so after a restore to
end E, each committed transaction holding n state records ends at most n + 1 offsets later (its
records and one commit marker); aborted transactions only push the true end further. The store
counts that (the turn calls ``stage``/``commit_staged``) and writes C with the transaction's
snapshots; C can lag the truth (a restart then replays a few records more) but never lead it.

**Restore write path.** A cold restore is CPU-bound on the worker's one Python thread, which
also parses every record in aiokafka; the store keeps its own share of that thread small. Pages
of about 233 records (under the cyclic collector's youngest generation, see
:func:`~streamsched.kafka.changelog.page_size`) are put into a RocksDB ``WriteBatch`` as they
come, values as their bytes (a prefix check, no decoding), and each ~4096 records go to the
writer thread as one write with the checkpoint, while the next pages are read (one write in
flight). The store is in *bulk* mode meanwhile: vector memtable, no compactions, no WAL. A crash
loses the memtables not yet flushed, which leaves a prefix of the writes, each with its own
checkpoint: a consistent older store, which the next start continues warm (or restores cold
when it is not trusted, e.g. nothing was flushed yet, not even the header); the changelog holds
everything. Before a write that has a WAL (the turn's), everything is flushed and the store
reopened normally (:meth:`ClaimStore._settle`), so a WAL never covers data the memtable lost.

Memory: a Python cache of decoded snapshots bounded in bytes (its share of the worker's
``cache_bytes``, least recently used out), plus RocksDB's block cache and memtables: all three
budgeted per worker, not per partition (:class:`StoreEnv`).

Measured (bench/restore.py, 1,000,000 identities over 8 partitions, one worker process, this
2-core machine shared with the broker and other jobs; medians of 3 after a warm-up, 2026-12-04,
before and after the small pages, run back to back): cold restore 4.5-4.8 s against 9.3-11.9 s
before, under a load average of 5-17 (raw read 3.0-3.5 s, ratio 0.67-0.73, before 0.40-0.48);
RSS 136-191 MB once restored (peak about 210 MB, as before); warm restart to ready 1.2-2.3 s at
that load. Where the time went before (1M records, in a worker process): 1.5-1.6 s of cyclic
collections (pages of 4096 records promoted through every generation), now 0.06-0.15 s; the
store's own Python share is about 0.15 s (the batch) and RocksDB's flushes about 0.8 CPU-s on
its background thread; the rest is aiokafka's per-record parsing, which the raw read pays too.

**A store that cannot be written** (disk full, a read-only or failing filesystem) is *broken*
and stops its partition cleanly: :mod:`streamsched.worker.storefaults`.

Why one module above ~400 lines: the trust rules (header, checkpoint, staged counting) and the
reads/writes they guard are one invariant; the engine tuning already lives in
:mod:`streamsched.worker.rocksenv` and the restore stream in :mod:`streamsched.kafka.changelog`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import shutil
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from streamsched.errors import ChangelogBehind, DecodeError, StoreUnwritable
from streamsched.kafka.changelog import Bounds, PartitionReader, TopicIdentity
from streamsched.kafka.progress import Progress
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import CLAIM_PREFIX, decode_claim, encode_claim, resolved_at
from streamsched.worker import heaptrim
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.statebase import FLOOR_IDENTITY, FLOOR_KEY, HORIZON_DEFAULT_S, StateBase
from streamsched.worker.storefaults import unwritable

log = logging.getLogger(__name__)
T = TypeVar("T")

FORMAT = 1
HEADER_KEY = b"\x00header"
CHECKPOINT_KEY = b"\x00checkpoint"
DATA_START = b"\x01"
"""Every data key sorts at or after this (reserved keys start with a zero byte)."""
_CHECKPOINT = struct.Struct(">qq")
SCAN_PAGE = 256
"""Entries one horizon scan step reads."""
RETENTION_MARGIN = 0.1
"""Fraction of delete.retention.ms (at least an hour) a store must be younger than beyond it."""
DIRTY_MAX = 4096
"""Snapshots held for the next checkpoint at most before they are written ahead of it."""
WRITE_RECORDS = 4096
"""Records gathered from the reader's pages into one write (and one checkpoint) of a restore."""
ENTRY_OVERHEAD = 480
"""Bytes a cached snapshot costs beyond its wire size (objects, strings, the LRU's entry)."""
class ClaimStore(StateBase):
    """One partition's claim snapshots in RocksDB, a bounded cache in front (see module docs)."""

    def __init__(self, env: StoreEnv, topic: str, partition: int, *,
                 horizon_s: float = HORIZON_DEFAULT_S, metrics: Metrics | None = None) -> None:
        super().__init__(partition, horizon_s=horizon_s)
        self.env = env
        self.metrics = metrics
        self.topic = topic
        self.path = env.path(topic, partition)
        self.ephemeral = False
        self.bulk = False
        self.offset = 0
        """Checkpoint: the changelog offset this store reflects."""
        self.checkpoint_at_ms = 0
        self._cache: OrderedDict[str, tuple[ClaimState, int]] = OrderedDict()
        self._cache_size = 0
        self._dirty: dict[bytes, bytes | None] = {}
        self._writing: concurrent.futures.Future[Any] | None = None
        self._db: Any = None
        env.caches.add(self)

    @property
    def decoded_bytes(self) -> int:
        """Bytes the cache of decoded snapshots holds (at most its share of ``env.cache_bytes``)."""
        return self._cache_size

    # --- files -------------------------------------------------------------------------------------

    def _open(self, *, bulk: bool = False) -> None:
        import rocksdict

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.bulk = bulk
        try:
            self._db = self._rdict(bulk)
        except Exception as exc:
            if "lock" not in str(exc).lower():
                raise
            # Another process (an earlier owner still stopping, or a zombie) holds it: never wait
            # for it; restore cold into a private directory instead.
            log.warning("claim store of %s[%d] is held by another process; restoring into a private "
                        "copy", self.topic, self.partition)
            self.path = self.path.with_name(f"{self.path.name}.{uuid.uuid4().hex[:8]}")
            self.ephemeral = True
            self._db = self._rdict(bulk)
        self.env.in_use.add(self.path)  # never swept while this process has it open
        if bulk:
            # No WAL while bulk loading: a crash loses the memtables, which leaves a prefix of the
            # pages (one column family flushes in order), each with its checkpoint. Everything is
            # flushed before the store is reopened with the WAL (never synced: a process crash
            # loses nothing, a power loss only a suffix, and the changelog replays it).
            no_wal = rocksdict.WriteOptions()
            no_wal.disable_wal = True  # type: ignore[method-assign,assignment]  # a property, not as stubbed
            self._db.set_write_options(no_wal)

    def open_existing(self) -> bool:
        """Open the store on disk; False (nothing opened) if there is none. First, once per
        partition opened: private copies a killed process left beside it are removed."""
        if self.env.sweep_copies(self.path):
            log.info("claim store of %s[%d]: removed private copies a killed process left",
                     self.topic, self.partition)
        if not (self.path / "CURRENT").exists():
            return False
        self._open()
        return True

    def _rdict(self, bulk: bool) -> Any:
        import rocksdict

        # The column family's options are given explicitly: rocksdict would otherwise take them
        # from the OPTIONS file the last open wrote.
        return rocksdict.Rdict(str(self.path), options=self.env.options(bulk=bulk),
                               column_families={"default": self.env.options(bulk=bulk)})

    def header(self) -> dict[str, Any] | None:
        raw = self._db.get(HEADER_KEY)
        try:
            doc = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def read_checkpoint(self) -> tuple[int, int] | None:
        raw = self._db.get(CHECKPOINT_KEY)
        if raw is None or len(raw) != _CHECKPOINT.size:
            return None
        offset, at_ms = _CHECKPOINT.unpack(raw)
        return int(offset), int(at_ms)

    def distrust(self, ident: TopicIdentity, bounds: Bounds, now_ms: int) -> str | None:
        """Why this store cannot be used warm (None: it can). Logged, so offsets and names only.
        A checkpoint past the end of this very topic incarnation raises :class:`ChangelogBehind`
        (module docs)."""
        head = self.header()
        if head is None:
            return "no local store"
        if [head.get(k) for k in ("format", "topic", "partition")] != [FORMAT, self.topic, self.partition]:
            return "a store of another format or partition"
        for key, known, other in (("cluster_id", ident.cluster_id, "another cluster"),
                                  ("topic_id", ident.topic_id, "another incarnation of the topic")):
            if head.get(key) != known:
                return (f"the state topic's {key} could not be read" if known is None
                        else f"a store of {other}")
        cp = self.read_checkpoint()
        if cp is None:
            return "a store without a checkpoint"
        offset, at_ms = cp
        if offset > bounds.end:  # of this very incarnation: the end is a stale leader's
            raise ChangelogBehind(self.topic, self.partition, offset, bounds.end)
        if offset < bounds.begin:
            return f"a store behind the changelog's start (checkpoint {offset} < {bounds.begin})"
        margin = max(3_600_000, int(ident.delete_retention_ms * RETENTION_MARGIN))
        if now_ms - at_ms > ident.delete_retention_ms - margin:
            return "a store older than the topic's delete.retention.ms (tombstones may be gone)"
        return None

    def wipe(self, ident: TopicIdentity, *, bulk: bool = True) -> None:
        """Delete everything and start a store for this topic incarnation (offset 0), open for a
        bulk load until :meth:`catch_up` is done (``bulk=False``: nothing to load; a bulk open
        costs a flush and a reopen at its end)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self.path, ignore_errors=True)
        self._open(bulk=bulk)
        self._cache.clear()
        self._cache_size = 0
        self._dirty.clear()
        self.offset, self.fence_floor = 0, 0
        doc = {"format": FORMAT, "topic": self.topic, "partition": self.partition,
               "cluster_id": ident.cluster_id, "topic_id": ident.topic_id,
               "created_ms": int(time.time() * 1000)}
        db: Any = self._db  # opened by _open
        db.put(HEADER_KEY, json.dumps(doc).encode())

    def close(self) -> None:
        try:
            self._wait_writer()  # never close the database under a running write (or reopen)
        except Exception as exc:  # noqa: BLE001 - closing anyway; the restore that wrote it failed
            log.debug("claim store of %s[%d]: last write failed: %s", self.topic, self.partition,
                      type(exc).__name__)
        if self._db is None:
            return
        db, self._db = self._db, None
        try:
            self._flush(db)
            db.flush()  # a shorter WAL replay at the next open
        except Exception as exc:
            if unwritable(exc) is None:
                raise
            # Whatever was not written is in the changelog: the next open catches up past it.
            log.warning("claim store of %s[%d]: not flushed at close (%s)", self.topic, self.partition,
                        unwritable(exc))
        finally:
            self._dirty.clear()
            try:
                db.close()  # releases the files and the lock even when it reports the last error
            except Exception as exc:
                if unwritable(exc) is None:
                    raise
            self.env.in_use.discard(self.path)
            heaptrim.trim_soon()  # what RocksDB freed goes back to the system (see heaptrim)
            if self.ephemeral:
                shutil.rmtree(self.path, ignore_errors=True)

    def failed(self, exc: BaseException) -> StoreUnwritable:
        """``exc`` (the filesystem refusing a write, see :func:`unwritable`) as the typed error
        that stops the partition; the gauge ``store_unwritable`` goes to 1."""
        if isinstance(exc, StoreUnwritable):
            return exc
        reason = unwritable(exc) or type(exc).__name__
        log.error("claim store of %s[%d] cannot be written (%s): the partition stops and restores "
                  "from the changelog once it can", self.topic, self.partition, reason)
        if self.metrics is not None:
            self.metrics.set_gauge("store_unwritable", 1, partition=str(self.partition))
        self.env.unwritable.add((self.topic, self.partition))
        return StoreUnwritable(self.topic, self.partition, reason)

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the env's writer thread (opening a store takes tens of milliseconds);
        tracked like a write, so :meth:`close` waits for it."""
        future = self.env.executor.submit(fn, *args)
        self._writing = future
        try:
            return await asyncio.wrap_future(future)
        finally:
            if future.done():
                self._writing = None

    def _wait_writer(self) -> None:
        if self._writing is not None:
            try:
                self._writing.result()
            finally:
                self._writing = None

    # --- restore -------------------------------------------------------------------------------------

    def _add_page(self, wb: Any, records: list[Any]) -> None:
        """The page's records into ``wb``: a snapshot is put as its bytes (never decoded here),
        a tombstone deletes, anything else is counted as corrupt and skipped."""
        put, delete, prefix, n = wb.put, wb.delete, CLAIM_PREFIX, len(CLAIM_PREFIX)
        bad = 0
        for rec in records:
            key, value = rec.key, rec.value
            if key is None:
                bad += 1
            elif value is None:
                delete(key)
            elif value[:n] == prefix:
                put(key, value)
            else:
                bad += 1  # not a claim snapshot: the identity keeps its previous one
        self.corrupt += bad
        self.restored_records += len(records) - bad

    async def _write_behind(self, wb: Any, position: int, at_ms: int) -> None:
        """``wb`` with the checkpoint ``position`` to the env's writer thread, once the write
        before it is done (one write in flight, so they land in order)."""
        wb.put(CHECKPOINT_KEY, _CHECKPOINT.pack(position, at_ms))
        if self._writing is not None:
            if self._writing.done():  # the usual case: no wake-up from the writer thread needed
                self._writing.result()  # raises if it failed
                await asyncio.sleep(0)  # still let the worker's other partitions run between writes
            else:
                await asyncio.wrap_future(self._writing)
        self._writing = self.env.executor.submit(self._db.write, wb)

    async def catch_up(self, reader: PartitionReader, start: int, end: int, progress: Progress) -> None:
        """Apply ``[start, end)`` of the changelog; the checkpoint moves with each write.

        The reader's pages are small (:func:`~streamsched.kafka.changelog.page_size`); they are
        gathered into one write of about :data:`WRITE_RECORDS`, written by the env's writer
        thread while the next pages are fetched and gathered. Each page is dropped once it is
        in the batch (its records never outlive the collector's youngest generation)."""
        import rocksdict

        at_ms = int(time.time() * 1000)  # records at or after ``end`` are written after this
        wb: Any = None
        gathered = 0
        try:
            async for records, position in reader.pages(start, end):
                if wb is None:
                    wb = rocksdict.WriteBatch(raw_mode=True)
                self._add_page(wb, records)
                gathered += len(records)
                del records
                if gathered >= WRITE_RECORDS:
                    await self._write_behind(wb, position, at_ms)
                    progress.page(gathered, position)
                    wb, gathered = None, 0
            if wb is not None:
                await self._write_behind(wb, position, at_ms)
                progress.page(gathered, position)
            if self._writing is not None:
                await asyncio.wrap_future(self._writing)
            self._writing = None
        finally:
            if self._writing is not None and not self._writing.done():
                self._wait_writer()  # never close the database under a running write
        self.offset, self.checkpoint_at_ms = end, at_ms
        self._db.put(CHECKPOINT_KEY, _CHECKPOINT.pack(end, at_ms))
        if self.bulk:
            # Off the event loop: a flush and a reopen take tens of milliseconds per store.
            await self.in_thread(self._settle)
        self._cache.clear()
        self._cache_size = 0
        floor = self._lookup(FLOOR_IDENTITY)
        self.fence_floor = floor.fence if floor is not None else 0

    def _settle(self) -> None:
        """End of a bulk load: flushed, then reopened with a skip-list memtable (point lookups)
        and compactions."""
        self._db.flush()
        self._db.close()
        self._db = None
        self._open()

    # --- the turn's interface ----------------------------------------------------------------------

    def _lookup(self, identity: str) -> ClaimState | None:
        hit = self._cache.get(identity)
        if hit is not None:
            self._cache.move_to_end(identity)
            return hit[0]
        key = identity.encode()
        raw = self._dirty[key] if key in self._dirty else self._db.get(key)
        if raw is None:
            return None
        try:
            st = decode_claim(raw)
        except (DecodeError, KeyError, ValueError):
            self.corrupt += 1  # reported by export_corrupt; the identity reads as unknown
            return None
        self._remember(identity, st, len(raw))
        return st

    def _remember(self, identity: str, st: ClaimState, size: int) -> None:
        old = self._cache.pop(identity, None)
        if old is not None:
            self._cache_size -= old[1]
        cost = size + len(identity) + ENTRY_OVERHEAD
        self._cache[identity] = (st, cost)
        self._cache_size += cost
        limit = self.env.store_cache_bytes()
        while self._cache_size > limit and self._cache:
            _, (_, evicted) = self._cache.popitem(last=False)
            self._cache_size -= evicted

    def put(self, state: ClaimState, raw: bytes | None = None) -> None:
        if raw is None:
            raw = encode_claim(state)
        self._dirty[state.identity.encode()] = raw
        self._remember(state.identity, state, len(raw))
        if len(self._dirty) >= DIRTY_MAX:
            self._flush()  # ahead of the checkpoint: a restart replays them, harmlessly

    def _drop(self, identities: list[str], floor: int) -> None:
        for identity in identities:
            old = self._cache.pop(identity, None)
            if old is not None:
                self._cache_size -= old[1]
            self._dirty[identity.encode()] = None
        if floor > self.fence_floor:
            self._dirty[FLOOR_KEY] = encode_claim(ClaimState(FLOOR_IDENTITY, fence=floor))

    def _committed(self, records: int, staged_at: float) -> None:
        if records:
            self.offset += records + 1  # the records and the commit marker (module docs)
            self.checkpoint_at_ms = int(staged_at * 1000)
            self._flush(checkpoint=True)
        elif self._dirty:
            self._flush()

    def _flush(self, db: Any = None, *, checkpoint: bool = False) -> None:
        import rocksdict

        if (not self._dirty and not checkpoint) or (db is None and self.broken is not None):
            return  # broken: what is not written stays in memory until the partition stops
        wb = rocksdict.WriteBatch(raw_mode=True)
        for key, raw in self._dirty.items():
            if raw is None:
                wb.delete(key)
            else:
                wb.put(key, raw)
        if checkpoint:
            wb.put(CHECKPOINT_KEY, _CHECKPOINT.pack(self.offset, self.checkpoint_at_ms))
        try:
            (db if db is not None else self._db).write(wb)
        except Exception as exc:
            if db is not None or unwritable(exc) is None:
                raise  # close() reports it; anything else is a bug, never masked
            # Never raised into the turn: its transaction committed; the partition stops cleanly
            # (partition.py), answering from memory until then. The checkpoint did not move.
            self.broken = self.failed(exc)
            return
        self._dirty.clear()

    def _scan_page(self, cursor: Any, cutoff_ns: int) -> tuple[list[str], Any]:
        found: list[str] = []
        seen, last = 0, cursor
        items = self._db.items(from_key=cursor if cursor is not None else DATA_START)
        try:
            for key, raw in items:
                if key == cursor:
                    continue
                if seen == SCAN_PAGE:
                    return found, last
                seen, last = seen + 1, key
                try:
                    at = resolved_at(raw)
                except IndexError:
                    continue  # a truncated record: never tombstoned by the scan
                if at is not None and at < cutoff_ns:
                    found.append(key.decode("ascii", "replace"))
        finally:
            del items
        return found, None

    def identities(self) -> int:
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

