"""Bounded due-work discovery: an in-memory index of future work with fair, paged sweeps.

Pure: no I/O, no asyncio, no clock reads. Every time is an ``int`` of UTC nanoseconds passed in by
the caller, so tests drive the index with any clock they like.

Why it exists
-------------
Some work is due later than "now": a retry after backoff, a one-time job with a future due time,
a queue deadline, a lease that must be reclaimed when it expires. A worker must never
sleep on such work while it holds a source partition: one long delay would block every healthy
record behind it and pin a partition nobody else can take over.

The mechanism
-------------
* **Delay topic (durable).** The worker writes the delayed work as a record to a delay topic and
  lets its source offset move on. The delay topic is the durable copy; nothing else about the
  delay lives only in memory.
* **In-memory due index (disposable).** A delay consumer reads those records and ``add``\\ s one
  :class:`DueItem` per record to a :class:`DueIndex`. The index is a cache of *hints*, never an
  authority: after a restart or a rebalance it is rebuilt by re-reading the delay topic, and the
  claim state machine (fencing token, exact successor revision, stored outcome) still decides
  whether an effect happens. An item swept twice across a crash is harmless; the local clock only
  picks *when to look*, the durable state decides *whether to act*.
* **Hard memory bound; pause intake when full.** The index holds at most ``max_items`` live
  items. When it is :attr:`~DueIndex.full`, :meth:`~DueIndex.add` refuses (returns ``False``
  and changes nothing) and the caller must pause the delay-topic partition (and not commit past
  the refused record) until :attr:`~DueIndex.free` grows again after a sweep. Memory is therefore
  bounded no matter how far ahead producers schedule work; backpressure lands on Kafka, which
  holds the backlog durably. Replacing an existing key never grows the index and is always
  accepted.
* **Bounded pages.** :meth:`~DueIndex.sweep` returns at most ``page_size`` (at most
  ``limits.MAX_SWEEP_PAGE`` = 32) due items per call, and optionally fewer (``deadline_items``:
  what the caller's remaining deadline or budget admits). Each tick therefore does a fixed amount
  of work and the caller can check its deadline between pages; a flood of due items is worked off
  page by page, never in one unbounded burst.
* **Fair sweep across partitions.** Like a scanner that alternates between its prefixes after
  every page, a sweep takes items round-robin from the source partitions that have due work, and
  the next sweep starts at the partition *after* the one served last. A partition with a million
  due items thus gets one slot per round, like every other partition; it cannot starve another
  partition, within one page or across pages. Within a partition, items come earliest-due first
  (ties in insertion order), so work added later, or due later, can never delay older due work
  indefinitely. A failing item comes back through ``add`` with a later due time (its next
  attempt), so it cannot monopolize pages either.
* **One wake-up, not one sleep per item.** :meth:`~DueIndex.next_due_ns` gives the earliest due
  time; the caller arms one bounded timer for it (capped by its tick), then sweeps.
* **Revocation.** When a source partition is revoked, :meth:`~DueIndex.remove_partition` drops
  its hints at once; the new owner rebuilds them from the delay topic.

Cost
----
Each partition has a binary heap of ``(due_ns, seq, key)`` entries, so ``add``, ``remove`` and
each item a sweep pops cost ``O(log n)``. Removal and replacement are lazy: the live entry is
dropped from a dictionary and its heap entry becomes garbage that is skipped when it surfaces.
A partition heap is compacted as soon as its garbage exceeds its live items, so the heaps never
hold more than twice the live items (:attr:`~DueIndex.footprint` ``<= 2 * len(index)``), and
compaction costs amortized ``O(1)`` per removal. A sweep additionally costs ``O(P log P)`` for
``P`` partitions holding items (it orders them to rotate fairly).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal, get_args

from streamsched.errors import BoundExceeded, ConfigError, InvalidDueItem
from streamsched.model import limits

__all__ = ["DueIndex", "DueItem", "DueKind"]

DueKind = Literal["retry", "due", "lease"]
"""``retry``: retry after backoff; ``due``: future due time or queue deadline; ``lease``: lease expiry."""

_KINDS: frozenset[str] = frozenset(get_args(DueKind))
_U64_MAX = 2**64 - 1


def _is_int(value: object) -> bool:
    return type(value) is int


@dataclass(frozen=True, slots=True)
class DueItem:
    """One piece of future work, as a hint for the caller.

    Attributes:
        key: Opaque identity of the work (for example the business identity); unique in an index.
            Non-empty, at most ``limits.MAX_DUE_KEY_LENGTH`` characters.
        partition: Source partition the work belongs to (>= 0); fairness and revocation use it.
        due_ns: When the work becomes due, UTC nanoseconds in ``[0, 2**64 - 1]``.
        kind: ``"retry"``, ``"due"`` or ``"lease"``.
        attempt: Attempt number the work will run as (>= 0); carried, never interpreted.
        ref: Opaque reference the caller keeps with the item (for example the delay-topic
            offset); never inspected, compared or hashed by the index.
    """

    key: str
    partition: int
    due_ns: int
    kind: DueKind
    attempt: int
    ref: object | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise InvalidDueItem("key", "must be a string")
        if not self.key:
            raise InvalidDueItem("key", "must not be empty")
        if len(self.key) > limits.MAX_DUE_KEY_LENGTH:
            raise BoundExceeded("due item key length", limits.MAX_DUE_KEY_LENGTH, len(self.key))
        if not _is_int(self.partition):
            raise InvalidDueItem("partition", "must be an integer")
        if self.partition < 0:
            raise BoundExceeded("due item partition", 0, self.partition)
        if not _is_int(self.due_ns):
            raise InvalidDueItem("due_ns", "must be an integer (UTC nanoseconds)")
        limits.check_range("due item due_ns", self.due_ns, 0, _U64_MAX)
        if self.kind not in _KINDS:
            raise InvalidDueItem("kind", "must be one of 'retry', 'due', 'lease'")
        if not _is_int(self.attempt):
            raise InvalidDueItem("attempt", "must be an integer")
        if self.attempt < 0:
            raise BoundExceeded("due item attempt", 0, self.attempt)


_Entry = tuple[int, int, str]
"""A heap entry: (due_ns, seq, key); ``seq`` orders equal due times FIFO and marks liveness."""


class _Partition:
    """The items of one source partition: a lazy-deletion heap plus the live items by key."""

    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[_Entry] = []
        self.live: dict[str, tuple[int, DueItem]] = {}

    def is_live(self, entry: _Entry) -> bool:
        current = self.live.get(entry[2])
        return current is not None and current[0] == entry[1]

    def top(self) -> _Entry | None:
        """The earliest live entry, discarding garbage that surfaced on top."""
        heap = self.heap
        while heap:
            if self.is_live(heap[0]):
                return heap[0]
            heapq.heappop(heap)
        return None

    def compact_if_needed(self) -> None:
        """Rebuild the heap from live items once garbage exceeds them (keeps heap <= 2 x live)."""
        if len(self.heap) - len(self.live) > len(self.live):
            self.heap = [(item.due_ns, seq, key) for key, (seq, item) in self.live.items()]
            heapq.heapify(self.heap)


class DueIndex:
    """In-memory index of future work per source partition, with a hard memory bound.

    See the module docstring for the mechanism. Not thread-safe; one owner (one event loop task)
    uses an index.

    Args:
        max_items: Capacity in live items, between 1 and ``limits.MAX_DUE_INDEX_ITEMS``.
        page_size: Most items one :meth:`sweep` returns, between 1 and ``limits.MAX_SWEEP_PAGE``.
    """

    __slots__ = ("_by_key", "_last_served", "_max_items", "_page_size", "_parts", "_seq")

    def __init__(
        self, max_items: int = limits.DEFAULT_DUE_INDEX_ITEMS, page_size: int = limits.MAX_SWEEP_PAGE
    ) -> None:
        if not _is_int(max_items):
            raise ConfigError("due index max_items must be an integer")
        limits.check_range("due index max_items", max_items, 1, limits.MAX_DUE_INDEX_ITEMS)
        if not _is_int(page_size):
            raise ConfigError("due index page_size must be an integer")
        limits.check_range("due index page_size", page_size, 1, limits.MAX_SWEEP_PAGE)
        self._max_items = max_items
        self._page_size = page_size
        self._parts: dict[int, _Partition] = {}
        self._by_key: dict[str, int] = {}  # key -> partition holding its live item
        self._seq = 0
        self._last_served: int | None = None

    # ----------------------------------------------------------------------------------- sizes

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def page_size(self) -> int:
        return self._page_size

    def __len__(self) -> int:
        return len(self._by_key)

    @property
    def full(self) -> bool:
        """True when a new key would be refused: the caller must pause intake."""
        return len(self._by_key) >= self._max_items

    @property
    def free(self) -> int:
        """How many more new keys fit (``max_items - len(self)``)."""
        return self._max_items - len(self._by_key)

    @property
    def footprint(self) -> int:
        """Heap entries held, live plus lazily deleted; always ``<= 2 * len(self)``."""
        return sum(len(part.heap) for part in self._parts.values())

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def get(self, key: str) -> DueItem | None:
        """The live item stored under ``key``, or ``None``."""
        partition = self._by_key.get(key)
        if partition is None:
            return None
        return self._parts[partition].live[key][1]

    def partitions(self) -> tuple[int, ...]:
        """The source partitions that currently hold at least one item, ascending."""
        return tuple(sorted(self._parts))

    # ------------------------------------------------------------------------------- mutations

    def add(self, item: DueItem) -> bool:
        """Index ``item``; ``False`` (and no change) if its key is new and the index is full.

        Adding a key that is already indexed **replaces** the stored item with the new one,
        whatever either due time is (the newest record about a key wins; it may be earlier,
        later, another kind or attempt, even another partition). A replacement never grows the
        index, so it is accepted even when the index is full.
        """
        if not isinstance(item, DueItem):
            raise TypeError("DueIndex.add expects a DueItem")
        key = item.key
        if key not in self._by_key and self.full:
            return False
        self._discard(key)
        self._seq += 1
        part = self._parts.get(item.partition)
        if part is None:
            part = self._parts[item.partition] = _Partition()
        part.live[key] = (self._seq, item)
        heapq.heappush(part.heap, (item.due_ns, self._seq, key))
        self._by_key[key] = item.partition
        return True

    def remove(self, key: str) -> bool:
        """Drop the item stored under ``key``; ``False`` if there is none."""
        return self._discard(key)

    def remove_partition(self, partition: int) -> int:
        """Drop every item of ``partition`` (it was revoked); returns how many were dropped."""
        part = self._parts.pop(partition, None)
        if part is None:
            return 0
        for key in part.live:
            del self._by_key[key]
        # _last_served may now name a dropped partition: rotation still resumes after its id.
        return len(part.live)

    def _discard(self, key: str) -> bool:
        partition = self._by_key.pop(key, None)
        if partition is None:
            return False
        part = self._parts[partition]
        del part.live[key]
        self._settle(partition, part)
        return True

    def _settle(self, partition: int, part: _Partition) -> None:
        """After a live item left ``part``: drop it if empty, else compact if garbage dominates."""
        if not part.live:
            del self._parts[partition]
        else:
            part.compact_if_needed()

    # ---------------------------------------------------------------------------------- sweeps

    def next_due_ns(self) -> int | None:
        """The earliest due time of any indexed item, or ``None`` when the index is empty."""
        earliest: int | None = None
        for part in self._parts.values():
            top = part.top()
            if top is not None and (earliest is None or top[0] < earliest):
                earliest = top[0]
        return earliest

    def sweep(self, now_ns: int, *, deadline_items: int | None = None) -> list[DueItem]:
        """Remove and return up to one page of items with ``due_ns <= now_ns``.

        At most ``page_size`` items, and at most ``deadline_items`` when given (how many the
        caller can still handle before its deadline; ``0`` returns nothing). Items are taken
        round-robin from the partitions with due work, one per partition per round, starting with
        the first partition (by id, cyclically) after the one served last by the previous sweep;
        within a partition earliest-due first, equal due times in insertion order. A page shorter
        than its limit means nothing else is due at ``now_ns``.
        """
        if not _is_int(now_ns):
            raise ConfigError("sweep now_ns must be an integer (UTC nanoseconds)")
        limit = self._page_size
        if deadline_items is not None:
            if not _is_int(deadline_items):
                raise ConfigError("sweep deadline_items must be an integer")
            if deadline_items < 0:
                raise BoundExceeded("sweep deadline_items", 0, deadline_items)
            limit = min(limit, deadline_items)
        if limit == 0 or not self._parts:
            return []

        order = sorted(self._parts)
        if self._last_served is not None:
            # Rotate so the first partition is the one after the last served (by id, cyclically).
            start = next((i for i, p in enumerate(order) if p > self._last_served), 0)
            order = order[start:] + order[:start]

        page: list[DueItem] = []
        ready = [(p, self._parts[p]) for p in order]
        while ready and len(page) < limit:
            still: list[tuple[int, _Partition]] = []
            for partition, part in ready:
                if len(page) >= limit:
                    break
                top = part.top()
                if top is None or top[0] > now_ns:
                    continue  # nothing (more) due here; out of this sweep's rotation
                heapq.heappop(part.heap)
                _, item = part.live.pop(top[2])
                del self._by_key[top[2]]
                page.append(item)
                self._last_served = partition
                still.append((partition, part))
            ready = still

        for partition in {item.partition for item in page}:
            self._settle(partition, self._parts[partition])
        return page
