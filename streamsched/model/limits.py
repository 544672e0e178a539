"""The explicit bounds in one place; every validator refers to these names."""

from __future__ import annotations

import math
from typing import TypeGuard

from streamsched.errors import BoundExceeded


def is_real(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool: what a numeric setting of a policy must be."""
    if isinstance(value, bool):
        return False
    # Ints are always finite; math.isfinite would overflow converting a huge one to float.
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))

MAX_TARGET_COMPONENTS = 8
MAX_TARGET_BYTES = 1024
MAX_COMPONENT_BYTES = 256
"""Per component of the identity (scheduler, selection, tenant): keeps encodings small."""
DEFAULT_IN_FLIGHT = 8
MAX_IN_FLIGHT = 8
MAX_DELIVERY_ATTEMPTS = 10
MAX_SELECTION_WAIT_S = 30.0
MIN_CLAIM_DURATION_S = 5.0
MAX_CLAIM_DURATION_S = 900.0
MAX_CLOCK_SKEW_S = 900.0
"""How far apart the wall clocks of one group's workers may be and still never take a live lease
early: another owner's claim whose lease ended longer ago than this (by the observer's clock) is
taken over at once, any younger one is watched for a whole claim duration first."""
MAX_RETRY_DELAY_S = 3600.0
MAX_PAYLOAD_BYTES = 256 * 1024
"""Largest JSON payload carried by a transition event."""
MAX_RECORD_BYTES = MAX_PAYLOAD_BYTES + 8 * 1024
"""Largest encoded record any decoder accepts (payload plus envelope)."""
MAX_NAME_LENGTH = 200
MAX_EVENT_ID_LENGTH = 128
MAX_JSON_DEPTH = 64
MAX_CATCH_UP = 64
MAX_HISTORY_ROWS = 256
MAX_SWEEP_PAGE = 32


def check_range(bound: str, value: float, low: float, high: float) -> None:
    """Raise :class:`BoundExceeded` unless ``low <= value <= high``."""
    if not (low <= value <= high):
        raise BoundExceeded(bound, high if value > high else low, value)


def check_max(bound: str, value: float, limit: float) -> None:
    if value > limit:
        raise BoundExceeded(bound, limit, value)


MAX_SPEC_LENGTH = 256
"""Longest schedule spec text ``specs.parse_spec`` accepts."""
MAX_TIMEZONE_LENGTH = 64
"""Longest IANA timezone key a cron spec accepts (real keys are at most about 32)."""
MIN_EVERY_INTERVAL_S = 1
MAX_EVERY_INTERVAL_S = 366 * 24 * 3600


MAX_DEAD_LETTER_BYTES = 2 * MAX_RECORD_BYTES
"""Largest encoded dead letter: it wraps an original value of up to MAX_RECORD_BYTES plus its key."""


DEFAULT_DUE_INDEX_ITEMS = 10_000
"""Default capacity (live items) of one in-memory ``duework.DueIndex``."""
MAX_DUE_INDEX_ITEMS = 1_000_000
"""Largest capacity a ``duework.DueIndex`` accepts; its heaps hold at most twice this many entries."""
MAX_DUE_KEY_LENGTH = 1024
"""Longest opaque key (characters) of a ``duework.DueItem``."""

MAX_PARK_S = max(MAX_RETRY_DELAY_S, MAX_CLAIM_DURATION_S)
"""The longest one delay record waits before it is due: a retry backoff (at most
``MAX_RETRY_DELAY_S``, 1 h) or a held lease (at most ``MAX_CLAIM_DURATION_S``). A transition
due further ahead than this is parked in hops of at most MAX_PARK_S (re-parked when it comes
back early), so no delay record ever needs a longer life than one hop plus the delay topic's
outage margin (see streamsched.kafka.admin)."""
