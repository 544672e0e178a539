"""Schedule boundaries as instants: integer nanoseconds since the Unix epoch (UTC), signed 64-bit.

Shared by every spec form (:mod:`streamsched.model.specs` for ``@every``/``@at`` and the grammar,
:mod:`streamsched.model.cron` for cron expressions). Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from typing import Final

from streamsched.errors import BoundExceeded

__all__ = ["MAX_BOUNDARY_NS", "MIN_BOUNDARY_NS", "NS_PER_S", "check_limit", "quote_token"]

NS_PER_S: Final = 1_000_000_000
MIN_BOUNDARY_NS: Final = -(2**63)
"""Earliest representable boundary (Kafka timestamps and Avro longs are signed 64-bit)."""
MAX_BOUNDARY_NS: Final = 2**63 - 1
"""Latest representable boundary."""


def check_limit(limit: int) -> None:
    """Refuse a negative ``limit`` of a ``boundaries`` call."""
    if limit < 0:
        raise BoundExceeded("boundaries limit", 0, limit)


def quote_token(token: str) -> str:
    """A spec token quoted for an error reason, cut to 24 characters (reasons stay short)."""
    return repr(token if len(token) <= 24 else token[:24] + "...")
