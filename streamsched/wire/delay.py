"""The delay record: a transition parked in the scheduler's co-partitioned delay topic.

A parked record is the transition itself (same key, same partition, ``attempt`` advanced for a
retry) plus one header saying when (UTC ns) it is due again. The worker writes it in the turn's
transaction (:func:`due_headers`) and reads it back when the delay partition is consumed
(:func:`due_ns`); both live here so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable

DUE_HEADER = "ss-due-ns"
"""Header of a delay-topic record: when (UTC ns) it is due again."""

Header = tuple[str, bytes]


def due_headers(due_ns: int) -> list[Header]:
    """The headers of a record parked until ``due_ns``."""
    return [(DUE_HEADER, str(due_ns).encode())]


def due_ns(headers: Iterable[Header] | None) -> int:
    """When a parked record is due; 0 (due now) if the header is missing or malformed."""
    for key, value in headers or ():
        if key == DUE_HEADER:
            try:
                return max(0, int(value))
            except ValueError:
                return 0
    return 0
