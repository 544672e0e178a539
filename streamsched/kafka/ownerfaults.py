"""A partition owner's failures: which are routine, how each is logged, and the crash tests'
injected ones. (Beside :mod:`streamsched.kafka.owner`, which calls :func:`log_failure` once per
failed owner; a fenced owner is logged there, as ``fenced out of topic[p]``.)

An owner fails, and restarts with backoff, for two kinds of reasons:

* **routine**: a fault the owner's code expects and explains, of the cluster or the machine,
  which a restart cures once the fault is gone: a broker that went away or timed out (aiokafka's
  retriable errors, :class:`KafkaTimeoutError`, an ``UNKNOWN_SERVER_ERROR`` answer of a broker
  cut off from the others, a connection or timeout error), a restore refused because the state
  topic's end came from a stale leader (:class:`ChangelogBehind`), a transaction given up at its
  deadline (:class:`TransactionStuck`), a claim store that cannot be written
  (:class:`StoreUnwritable`, which logs its own ERROR when it breaks), an unreachable schema
  registry, a crash test's :class:`InjectedFault`. One WARNING line each,
  ``owner of topic[p] failed: Type (why)``; the traceback at DEBUG only. A fault that lasts
  still shows: every restart logs again, and giving a partition up is an ERROR.
* **unexpected**: anything else (an ``AttributeError``, a ``KeyError``: a defect). One ERROR
  line ``owner of topic[p] failed: Type`` followed by its traceback, rendered by
  :func:`streamsched.logs.safe_traceback` (frames and exception types; never an exception's
  message, which may quote payload). The full traceback, messages included, is logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from streamsched import settings
from streamsched.errors import (
    ChangelogBehind,
    OffsetsNotStable,
    RegistryUnavailable,
    RoundAborted,
    StoreUnwritable,
    StreamschedError,
    TransactionStuck,
)
from streamsched.logs import safe_traceback

log = logging.getLogger("streamsched.kafka.owner")
"""The owner's logger: its lines keep the name they always had."""

FAULTS_ENV = "STREAMSCHED_OWNER_FAULTS"
"""Crash tests only (like :mod:`streamsched.failpoints`): ``STREAMSCHED_OWNER_FAULTS=0.2`` makes
each owner, with probability 0.2, fail with :class:`InjectedFault` within 3 s of being restored,
so restarts overlap rebalances (tests/crash/test_rebalance_storm.py). Unset: one lookup, no cost."""


class InjectedFault(StreamschedError):
    """A failure injected by :data:`FAULTS_ENV` (never raised in production)."""

    kind = "injected_fault"


ROUTINE_ERRORS: dict[type[BaseException], str] = {
    ChangelogBehind: "the state topic's end was read from a stale leader; restoring again",
    TransactionStuck: "a transaction did not commit within its deadline",
    RoundAborted: "the transaction it shared with the member's other partitions aborted",
    OffsetsNotStable: "an earlier owner's transaction still held the partition's offsets",
    StoreUnwritable: "its claim store cannot be written",
    RegistryUnavailable: "the schema registry is unavailable",
    InjectedFault: "injected by STREAMSCHED_OWNER_FAULTS",
    TimeoutError: "a request timed out",
    ConnectionError: "a connection failed",
}
"""Routine failures of streamsched's own (and Python's) types, with why they happen."""
BROKER_WHY = "the cluster did not answer as it should (a broker went away, timed out or moved)"


def _broker_errors() -> tuple[type[BaseException], ...]:
    # aiokafka errors a broker's state explains (non-retriable ones that still are): imported
    # when a failure is classified, so importing this module does not import aiokafka.
    from aiokafka.errors import KafkaTimeoutError, UnknownError

    return KafkaTimeoutError, UnknownError


def routine(exc: BaseException) -> str | None:
    """Why ``exc`` is a routine owner failure (see the module docs), or None: unexpected."""
    for kind, why in ROUTINE_ERRORS.items():
        if isinstance(exc, kind):
            return why
    from aiokafka.errors import KafkaError

    if isinstance(exc, KafkaError) and (exc.retriable or isinstance(exc, _broker_errors())):
        return BROKER_WHY
    return None


def log_failure(topic: str, partition: int, exc: BaseException) -> None:
    """The one line (and, if unexpected, the traceback) an owner's failure logs."""
    name = type(exc).__name__
    why = routine(exc)
    if why is not None:
        log.warning("owner of %s[%d] failed: %s (%s)", topic, partition, name, why)
    else:
        log.error("owner of %s[%d] failed: %s\n%s", topic, partition, name, safe_traceback(exc))
    log.debug("owner of %s[%d] failed", topic, partition, exc_info=exc)


def _fault_delay() -> float | None:
    rate = settings.value(FAULTS_ENV) or 0.0
    return random.uniform(0.0, 3.0) if rate > 0 and random.random() < rate else None


async def run_body(run: Callable[[], Awaitable[None]]) -> None:
    """``run()``, or, under :data:`FAULTS_ENV`, cut short by an injected failure."""
    delay = _fault_delay()
    if delay is None:
        await run()
        return
    inner = asyncio.ensure_future(run())
    try:
        await asyncio.wait_for(asyncio.shield(inner), delay)
    except TimeoutError:
        raise InjectedFault("injected owner failure") from None
    finally:
        if not inner.done():
            inner.cancel()
            with contextlib.suppress(BaseException):
                await inner
