"""The log lines of an item's failures: one per failed attempt, one per dead letter.

A handler or command that fails, and a record that is dead-lettered, each log one WARNING line
(the default level shows it). What the line holds is safe by construction: the scheduler, the
partition, the identity's ``sched_`` digest, the offset and fence (as the line's context, see
:mod:`streamsched.logs`), the attempt, the error's kind and its exception type's name. Never
the payload, the plaintext identity or the exception's message, which may quote either; the
traceback (with the message) is logged at DEBUG only.

Both lines repeat per item, so a flood of failures (a poison batch, a destination that is
down) is rate-limited per (scheduler, line, kind) by one process-wide
:class:`~streamsched.logs.RateLimiter`: the first :data:`LINES` per :data:`INTERVAL_S`, then a
"N more suppressed" line when the key logs again. The metrics (``errors{kind}``,
``dead_lettered``, ``retries``...) count every one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamsched.logs import RateLimiter, safe_traceback
from streamsched.model.retry import FailureRecord

if TYPE_CHECKING:
    from streamsched.worker.selection import Item

log = logging.getLogger(__name__)

LINES = 10
INTERVAL_S = 60.0
LIMITER = RateLimiter(lines=LINES, interval_s=INTERVAL_S)
"""Shared by every partition of the process (a module value, like the logging it guards)."""


def attempt_failed(scheduler: str, identity: str, failure: FailureRecord, next_step: str,
                   exc: BaseException) -> None:
    """One failed attempt of ``identity`` and what happens next (``next_step``: a fixed phrase
    with numbers, e.g. "retried in place in 0.12 s", "dead-lettered")."""
    extra: dict[str, object] = {"scheduler": scheduler, "identity": identity}
    key = (scheduler, "failed attempt", failure.cause_kind)
    if LIMITER.log(log, logging.WARNING, key, "attempt %d failed: %s (%s); %s", failure.attempt,
                   failure.cause_kind, failure.error_type, next_step, extra=extra):
        # Where it failed, never what the message says (a handler may quote its payload there).
        log.debug("attempt %d failed\n%s", failure.attempt, safe_traceback(exc), extra=extra)


def dead_lettered(scheduler: str, letters: Iterable[tuple[Item, tuple[str, str], int]]) -> None:
    """Dead letters just committed, each with its ``(kind, reason)`` and the attempt that failed
    last (0: the record's own, e.g. one that never ran). The reason is named only for a handler's
    terminal failure (a cause kind, from a fixed vocabulary); other reasons may quote what a
    decoder saw, and the dead letter itself keeps them."""
    for it, (kind, reason), attempt in letters:
        rec = it.record
        extra: dict[str, object] = {"scheduler": scheduler, "offset": rec.offset,
                                    "identity": it.identity or None}
        why = f" ({reason})" if kind == "terminal" else ""
        LIMITER.log(log, logging.WARNING, (scheduler, "dead letter", kind),
                    "dead-lettered a record of %s: %s%s, attempt %d", rec.topic, kind, why,
                    attempt or (it.event.attempt if it.event is not None else 1), extra=extra)
