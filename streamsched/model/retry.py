"""Retry policy, backoff arithmetic and failure normalization (pure: no I/O, no clock reads).

Modelled on temporalio's ``RetryPolicy`` (initial interval, coefficient, maximum interval, maximum
attempts) and dramatiq's ``compute_backoff`` (exponential growth capped without overflow, jitter).
Attempts are counted from 1: ``attempt`` is the number of deliveries that have failed so far.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from streamsched import errors
from streamsched.errors import BoundExceeded, ConfigError, StreamschedError
from streamsched.model import limits

__all__ = [
    "FailureRecord",
    "RetryPolicy",
    "Retryable",
    "Terminal",
    "compute_backoff",
    "is_transient",
    "normalize_failure",
    "should_retry",
]


class Retryable(StreamschedError):
    """Raised by a handler for a failure that may succeed on a later attempt (transient)."""

    kind = "retryable"


class Terminal(StreamschedError):
    """Raised by a handler for a failure that no retry can fix (permanent; dead-lettered)."""

    kind = "terminal"



@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how fast a failed delivery is retried.

    Attributes:
        initial_interval_s: Delay in seconds before the first retry (after attempt 1 failed); > 0.
        backoff_coefficient: Factor the delay grows by per further failure; >= 1 (1 = constant).
        maximum_interval_s: Cap on any single delay in seconds, jitter included; at least
            ``initial_interval_s`` and at most ``limits.MAX_RETRY_DELAY_S``.
        maximum_attempts: Total deliveries including the first; after this many failures the
            failure is final. Between 1 (never retry) and ``limits.MAX_DELIVERY_ATTEMPTS``.
        jitter: Fraction in [0, 1] of the base delay by which a delay is spread uniformly in
            ``[base * (1 - jitter), base * (1 + jitter))``, so retries of many records don't
            arrive in lockstep; 0 makes delays deterministic.
    """

    initial_interval_s: float = 0.1
    backoff_coefficient: float = 2.0
    maximum_interval_s: float = 10.0
    maximum_attempts: int = 5
    jitter: float = 0.2

    def __post_init__(self) -> None:
        for name in ("initial_interval_s", "backoff_coefficient", "maximum_interval_s", "jitter"):
            if not limits.is_real(getattr(self, name)):
                raise ConfigError(f"retry policy {name} must be a finite number")
        if self.initial_interval_s <= 0:
            raise ConfigError("retry policy initial_interval_s must be > 0")
        if self.backoff_coefficient < 1:
            raise ConfigError("retry policy backoff_coefficient must be >= 1")
        limits.check_max("retry policy maximum_interval_s", self.maximum_interval_s, limits.MAX_RETRY_DELAY_S)
        if self.maximum_interval_s < self.initial_interval_s:
            raise ConfigError("retry policy maximum_interval_s must be >= initial_interval_s")
        if type(self.maximum_attempts) is not int:
            raise ConfigError("retry policy maximum_attempts must be an integer")
        limits.check_range(
            "retry policy maximum_attempts", self.maximum_attempts, 1, limits.MAX_DELIVERY_ATTEMPTS
        )
        if not 0 <= self.jitter <= 1:
            raise ConfigError("retry policy jitter must be between 0 and 1")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """:func:`compute_backoff` with ``rand`` drawn from ``rng`` (default: the module RNG)."""
        rand = (rng if rng is not None else random).random()
        return compute_backoff(self, attempt, rand=rand)


def _check_attempt(attempt: int) -> None:
    if type(attempt) is not int:
        raise ConfigError("attempt must be an integer")
    if attempt < 1:
        raise BoundExceeded("attempt", 1, attempt)


def compute_backoff(policy: RetryPolicy, attempt: int, *, rand: float) -> float:
    """Seconds to wait before attempt ``attempt + 1`` after ``attempt`` failures (``attempt >= 1``).

    ``base = min(maximum_interval_s, initial_interval_s * backoff_coefficient ** (attempt - 1))``,
    evaluated through logarithms so that huge ``attempt`` values never overflow; then
    ``base * (1 + jitter * (2 * rand - 1))`` clamped to ``[0, maximum_interval_s]``. Deterministic in
    ``rand``, which must be in ``[0, 1)``; with ``jitter == 0`` the result is non-decreasing in
    ``attempt``.
    """
    _check_attempt(attempt)
    if not (limits.is_real(rand) and 0 <= rand < 1):
        raise BoundExceeded("backoff rand", 1, rand)
    exponent = attempt - 1
    coefficient = policy.backoff_coefficient
    cap = policy.maximum_interval_s
    if coefficient == 1 or exponent == 0:
        base = policy.initial_interval_s
    else:
        # exponent (an int, possibly huge) is compared with a float exactly; coefficient ** exponent
        # is only evaluated when it stays below cap / initial, so it cannot overflow.
        threshold = math.log(cap / policy.initial_interval_s) / math.log(coefficient)
        base = cap if exponent >= threshold else policy.initial_interval_s * coefficient**exponent
    base = min(cap, base)
    delay = base * (1 + policy.jitter * (2 * rand - 1))
    return min(cap, max(0.0, delay))


def should_retry(policy: RetryPolicy, attempt: int, retryable: bool) -> bool:
    """Whether a failure of attempt ``attempt`` (1-based) should be delivered again."""
    _check_attempt(attempt)
    return retryable and attempt < policy.maximum_attempts


CauseKind = Literal[
    "timeout",
    "cancelled",
    "conflict",
    "transport",
    "handler_retryable",
    "handler_terminal",
    "decode",
    "bound",
    "internal",
]
Category = Literal["transient", "permanent"]
_TRANSIENT: frozenset[str] = frozenset({"timeout", "cancelled", "conflict", "transport", "handler_retryable"})


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A failure reduced to stable, payload-free facts (safe to log and to persist).

    Attributes:
        cause_kind: Stable cause name: ``timeout``, ``cancelled``, ``conflict``, ``transport``,
            ``handler_retryable``, ``handler_terminal``, ``decode``, ``bound`` or ``internal``.
        category: ``transient`` (the cause may go away) or ``permanent``.
        retryable: Whether another attempt will be made: transient and attempts remain.
        attempt: The 1-based attempt that failed.
        max_attempts: The policy's ``maximum_attempts`` at the time of failure.
        at_ns: When the failure was observed (caller's clock, ns since the epoch).
        error_type: The exception's class name only; never its message, which may carry payload.
    """

    cause_kind: str
    category: Category
    retryable: bool
    attempt: int
    max_attempts: int
    at_ns: int
    error_type: str


_TRANSPORT_LOADERS: list[Callable[[], tuple[type[BaseException], ...]]] = []


def register_transport_errors(loader: Callable[[], tuple[type[BaseException], ...]]) -> None:
    """Declare client exception types that mean "transport uncertain" (retryable).

    The model stays free of Kafka: :mod:`streamsched.kafka.clients` registers a loader of
    aiokafka's connection and request-timeout errors when it is imported; the loader runs only
    when a failure is classified, so registering imports nothing.
    """
    if loader not in _TRANSPORT_LOADERS:
        _TRANSPORT_LOADERS.append(loader)


def _transport_types() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for load in _TRANSPORT_LOADERS:
        try:
            found += load()
        except ImportError:  # the client library is not installed: nothing to classify
            continue
    return tuple(found)


def _cause_kind(exc: BaseException) -> CauseKind:
    # Order matters: TimeoutError is an OSError, and Retryable/Terminal are StreamschedErrors.
    if isinstance(exc, Retryable):
        return "handler_retryable"
    if isinstance(exc, Terminal):
        return "handler_terminal"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, errors.RevisionConflict | errors.LeaseHeld):
        return "conflict"
    if isinstance(exc, errors.DecodeError):
        return "decode"
    if isinstance(exc, errors.BoundExceeded):
        return "bound"
    if isinstance(exc, (*_transport_types(), ConnectionError, OSError)):
        return "transport"
    return "internal"


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure the downstream may recover from (the ``transient`` category of
    :func:`normalize_failure`), what a circuit breaker counts against the system called."""
    return _cause_kind(exc) in _TRANSIENT


def normalize_failure(exc: BaseException, *, attempt: int, policy: RetryPolicy, now_ns: int) -> FailureRecord:
    """Classify ``exc`` from attempt ``attempt`` into a :class:`FailureRecord`.

    ``TimeoutError`` (= ``asyncio.TimeoutError``) → timeout, ``asyncio.CancelledError`` → cancelled,
    ``RevisionConflict``/``LeaseHeld`` → conflict, ``ConnectionError``/``OSError`` and aiokafka's
    ``KafkaConnectionError``/``RequestTimedOutError`` → transport, :class:`Retryable` →
    handler_retryable: all transient. :class:`Terminal` → handler_terminal, ``DecodeError`` →
    decode, ``BoundExceeded`` → bound, anything else → internal: all permanent. A transient failure
    keeps its category but is not retryable once ``attempt >= policy.maximum_attempts``.
    """
    _check_attempt(attempt)
    kind = _cause_kind(exc)
    category: Category = "transient" if kind in _TRANSIENT else "permanent"
    return FailureRecord(
        cause_kind=kind,
        category=category,
        retryable=should_retry(policy, attempt, category == "transient"),
        attempt=attempt,
        max_attempts=policy.maximum_attempts,
        at_ns=now_ns,
        error_type=type(exc).__name__,
    )
