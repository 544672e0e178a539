"""Commit watermarks of one partition: what offsets may be committed, as a pure value.

The transition partition resolves in order; the delay partition out of order (re-driven
records come back by due time), so its watermark is the lowest offset still outstanding.
Batches are described by :class:`Resolved` (the transition offset after a batch's last record,
and the delay offsets it re-drove), so this module knows nothing of items or Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Resolved(Protocol):
    """What one batch covers: ``next_offset`` (transition offset after its last record, None if
    it held none) and ``delayed`` (the delay-topic offsets it re-drove)."""

    @property
    def next_offset(self) -> int | None: ...

    @property
    def delayed(self) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class Span:
    """A plain :class:`Resolved` (tests and callers without a batch object)."""

    next_offset: int | None
    delayed: Sequence[int] = ()


class Offsets:
    """What may be committed: the transition partition resolves in order, the delay partition
    out of order (re-driven records come back by due time), so its watermark is the lowest
    offset still outstanding."""

    __slots__ = ("d_high", "d_outstanding", "d_sent", "t_next", "t_offered", "t_sent")

    def __init__(self) -> None:
        self.t_offered: int | None = None
        self.t_next: int | None = None
        self.t_sent: int | None = None
        self.d_outstanding: set[int] = set()
        self.d_high: int | None = None
        self.d_sent: int | None = None

    def seed(self, transition: int | None, delay: int | None) -> None:
        """Start from the committed offsets (``None``: nothing committed yet).

        A new owner that receives no record must still step over a trailing transaction marker
        (its position moves past it, its committed offset does not): with the start seeded,
        the partition is "settled" from the first moment and :meth:`skip_markers` can advance.
        The caller guarantees that every record the consumer returned is offered to the turn
        (a record never offered must be sought back to, never skipped).
        """
        if transition is not None:
            self.t_next = self.t_offered = self.t_sent = transition
        if delay is not None:
            self.d_high = self.d_sent = delay

    def note_delayed(self, offset: int) -> None:
        self.d_outstanding.add(offset)
        self.d_high = max(self.d_high or 0, offset + 1)

    def after(self, batch: Resolved | None) -> tuple[int | None, int | None]:
        """(transition, delay) watermarks once ``batch`` is resolved."""
        t = self.t_next
        if batch is not None and batch.next_offset is not None:
            t = batch.next_offset if t is None else max(t, batch.next_offset)
        outstanding = self.d_outstanding - set(batch.delayed) if batch is not None else self.d_outstanding
        d = min(outstanding) if outstanding else self.d_high
        return t, d

    def note_offered(self, offset: int) -> None:
        self.t_offered = offset + 1

    def skip_markers(self, t_position: int | None, d_position: int | None) -> None:
        """Advance over transaction markers once everything offered is resolved.

        A transactional upstream leaves control records after its data; the consumer's position
        moves past them, the last record's offset + 1 does not. Only when every record handed
        to the turn is resolved is the gap known to hold markers alone.
        """
        settled = self.t_next is not None and self.t_next == self.t_offered
        if settled and t_position is not None and self.t_next is not None and t_position > self.t_next:
            self.t_next = self.t_offered = t_position
        if d_position is not None and not self.d_outstanding and self.d_high is not None:
            self.d_high = max(self.d_high, d_position)

    def resolve(self, batch: Resolved) -> None:
        self.t_next, _ = self.after(batch)
        self.d_outstanding.difference_update(batch.delayed)

    def unsent(self) -> bool:
        t, d = self.after(None)
        return t != self.t_sent or d != self.d_sent
