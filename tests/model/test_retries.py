"""Unit and property tests for streamsched.retries (pure logic, no broker)."""

from __future__ import annotations

import asyncio
import math
import random
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched import errors
from streamsched.errors import BoundExceeded, ConfigError, StreamschedError
from streamsched.kafka import clients as _clients  # noqa: F401  (registers the Kafka transport errors)
from streamsched.model import limits
from streamsched.model.retry import (
    FailureRecord,
    Retryable,
    RetryPolicy,
    Terminal,
    compute_backoff,
    normalize_failure,
    should_retry,
)

# ------------------------------------------------------------------------------------------ policy


def test_defaults() -> None:
    policy = RetryPolicy()
    assert policy.initial_interval_s == 0.1
    assert policy.backoff_coefficient == 2.0
    assert policy.maximum_interval_s == 10.0
    assert policy.maximum_attempts == 5
    assert policy.jitter == 0.2


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"initial_interval_s": 0}, ConfigError),
        ({"initial_interval_s": -1.0}, ConfigError),
        ({"initial_interval_s": math.nan}, ConfigError),
        ({"initial_interval_s": math.inf}, ConfigError),
        ({"initial_interval_s": "1"}, ConfigError),
        ({"backoff_coefficient": 0.5}, ConfigError),
        ({"backoff_coefficient": math.nan}, ConfigError),
        ({"maximum_interval_s": limits.MAX_RETRY_DELAY_S + 1}, BoundExceeded),
        ({"initial_interval_s": 2.0, "maximum_interval_s": 1.0}, ConfigError),
        ({"maximum_attempts": 0}, BoundExceeded),
        ({"maximum_attempts": limits.MAX_DELIVERY_ATTEMPTS + 1}, BoundExceeded),
        ({"maximum_attempts": 2.0}, ConfigError),
        ({"maximum_attempts": True}, ConfigError),
        ({"jitter": -0.1}, ConfigError),
        ({"jitter": 1.5}, ConfigError),
        ({"jitter": math.nan}, ConfigError),
    ],
)
def test_policy_validation(kwargs: dict[str, object], error: type[StreamschedError]) -> None:
    with pytest.raises(error) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert type(info.value) is error
    assert str(info.value)


def test_policy_bounds_are_inclusive() -> None:
    RetryPolicy(maximum_interval_s=limits.MAX_RETRY_DELAY_S, maximum_attempts=limits.MAX_DELIVERY_ATTEMPTS)
    RetryPolicy(initial_interval_s=1.0, maximum_interval_s=1.0, backoff_coefficient=1.0, jitter=0.0)
    RetryPolicy(maximum_attempts=1, jitter=1.0)


# ----------------------------------------------------------------------------------------- backoff


def test_exponential_backoff_without_jitter() -> None:
    policy = RetryPolicy(jitter=0.0)
    delays = [compute_backoff(policy, attempt, rand=0.5) for attempt in range(1, 11)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0])


def test_jitter_spreads_around_base() -> None:
    policy = RetryPolicy(initial_interval_s=1.0, maximum_interval_s=100.0, jitter=0.2)
    assert compute_backoff(policy, 3, rand=0.0) == pytest.approx(4.0 * 0.8)
    assert compute_backoff(policy, 3, rand=0.5) == pytest.approx(4.0)
    assert compute_backoff(policy, 3, rand=0.75) == pytest.approx(4.0 * 1.1)
    assert compute_backoff(policy, 3, rand=math.nextafter(1.0, 0.0)) == pytest.approx(4.0 * 1.2)


def test_jitter_is_clamped_to_the_maximum_and_zero() -> None:
    policy = RetryPolicy(initial_interval_s=1.0, maximum_interval_s=5.0, jitter=1.0)
    assert compute_backoff(policy, 10, rand=0.99) == 5.0
    assert compute_backoff(policy, 1, rand=0.0) == 0.0


def test_huge_attempts_do_not_overflow() -> None:
    policy = RetryPolicy(jitter=0.0)
    assert compute_backoff(policy, 10**6, rand=0.0) == 10.0
    assert compute_backoff(policy, 10**400, rand=0.0) == 10.0
    steep = RetryPolicy(backoff_coefficient=1e300, jitter=0.0)
    assert compute_backoff(steep, 1, rand=0.0) == 0.1
    assert compute_backoff(steep, 3, rand=0.0) == 10.0
    flat = RetryPolicy(backoff_coefficient=1.0, jitter=0.0)
    assert compute_backoff(flat, 10**400, rand=0.0) == 0.1


def test_backoff_rejects_bad_arguments() -> None:
    policy = RetryPolicy()
    with pytest.raises(BoundExceeded):
        compute_backoff(policy, 0, rand=0.0)
    with pytest.raises(BoundExceeded):
        compute_backoff(policy, 1, rand=1.0)
    with pytest.raises(BoundExceeded):
        compute_backoff(policy, 1, rand=-0.1)
    with pytest.raises(BoundExceeded):
        compute_backoff(policy, 1, rand=math.nan)
    with pytest.raises(BoundExceeded):
        compute_backoff(policy, 1, rand=10**400)
    with pytest.raises(ConfigError):
        compute_backoff(policy, 1.5, rand=0.0)  # type: ignore[arg-type]


def test_delay_uses_the_given_rng() -> None:
    policy = RetryPolicy()
    expected = compute_backoff(policy, 2, rand=random.Random(7).random())
    assert policy.delay(2, random.Random(7)) == expected
    assert 0.0 <= policy.delay(2) <= policy.maximum_interval_s


_policies = st.builds(
    RetryPolicy,
    initial_interval_s=st.floats(min_value=1e-6, max_value=10.0),
    backoff_coefficient=st.floats(min_value=1.0, max_value=1e6),
    maximum_interval_s=st.floats(min_value=10.0, max_value=limits.MAX_RETRY_DELAY_S),
    maximum_attempts=st.integers(min_value=1, max_value=limits.MAX_DELIVERY_ATTEMPTS),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
_rands = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(policy=_policies, attempt=st.integers(min_value=1, max_value=10**30), rand=_rands)
def test_backoff_is_always_within_bounds(policy: RetryPolicy, attempt: int, rand: float) -> None:
    delay = compute_backoff(policy, attempt, rand=rand)
    assert 0.0 <= delay <= policy.maximum_interval_s
    assert compute_backoff(policy, attempt, rand=rand) == delay


@given(policy=_policies, attempt=st.integers(min_value=1, max_value=10_000), rand=_rands)
def test_backoff_without_jitter_is_monotone(policy: RetryPolicy, attempt: int, rand: float) -> None:
    flat = RetryPolicy(
        initial_interval_s=policy.initial_interval_s,
        backoff_coefficient=policy.backoff_coefficient,
        maximum_interval_s=policy.maximum_interval_s,
        jitter=0.0,
    )
    assert compute_backoff(flat, attempt, rand=rand) <= compute_backoff(flat, attempt + 1, rand=rand)
    assert compute_backoff(flat, 1, rand=rand) == flat.initial_interval_s


@pytest.mark.parametrize(
    ("attempt", "retryable", "expected"),
    [(1, True, True), (4, True, True), (5, True, False), (6, True, False), (1, False, False)],
)
def test_should_retry(attempt: int, retryable: bool, expected: bool) -> None:
    assert should_retry(RetryPolicy(maximum_attempts=5), attempt, retryable) is expected


def test_single_attempt_policy_never_retries() -> None:
    assert not should_retry(RetryPolicy(maximum_attempts=1), 1, True)
    with pytest.raises(BoundExceeded):
        should_retry(RetryPolicy(), 0, True)


# ----------------------------------------------------------------------------------- normalization


class HandlerTimeout(Retryable):
    pass


def _kafka_errors() -> list[tuple[BaseException, str, str]]:
    try:
        from aiokafka.errors import KafkaConnectionError, RequestTimedOutError
    except ImportError:  # pragma: no cover - aiokafka is a project dependency
        return []
    return [
        (KafkaConnectionError("secret"), "transport", "KafkaConnectionError"),
        (RequestTimedOutError("secret"), "transport", "RequestTimedOutError"),
    ]


_TABLE: list[tuple[BaseException, str, str]] = [
    # asyncio.TimeoutError is the builtin TimeoutError since Python 3.11 (and a subclass of OSError).
    (TimeoutError("secret"), "timeout", "TimeoutError"),
    (asyncio.CancelledError("secret"), "cancelled", "CancelledError"),
    (errors.RevisionConflict("id", 3, 2), "conflict", "RevisionConflict"),
    (errors.LeaseHeld("id", "owner", 5), "conflict", "LeaseHeld"),
    (ConnectionRefusedError("secret"), "transport", "ConnectionRefusedError"),
    (ConnectionResetError("secret"), "transport", "ConnectionResetError"),
    (OSError("secret"), "transport", "OSError"),
    (Retryable("secret"), "handler_retryable", "Retryable"),
    (HandlerTimeout("secret"), "handler_retryable", "HandlerTimeout"),
    (Terminal("secret"), "handler_terminal", "Terminal"),
    (errors.DecodeError("secret"), "decode", "DecodeError"),
    (errors.BoundExceeded("payload bytes", 10, 11), "bound", "BoundExceeded"),
    (ValueError("secret"), "internal", "ValueError"),
    (KeyError("secret"), "internal", "KeyError"),
    (errors.FencedOut("t", 0), "internal", "FencedOut"),
    (errors.StaleFence("id", 1, 2), "internal", "StaleFence"),
    (KeyboardInterrupt(), "internal", "KeyboardInterrupt"),
    *_kafka_errors(),
]
_TRANSIENT = {"timeout", "cancelled", "conflict", "transport", "handler_retryable"}


@pytest.mark.parametrize(("exc", "cause_kind", "error_type"), _TABLE, ids=lambda v: type(v).__name__)
def test_normalize_failure_table(exc: BaseException, cause_kind: str, error_type: str) -> None:
    policy = RetryPolicy(maximum_attempts=3)
    transient = cause_kind in _TRANSIENT
    record = normalize_failure(exc, attempt=1, policy=policy, now_ns=123)
    assert record == FailureRecord(
        cause_kind=cause_kind,
        category="transient" if transient else "permanent",
        retryable=transient,
        attempt=1,
        max_attempts=3,
        at_ns=123,
        error_type=error_type,
    )
    assert "secret" not in repr(record)
    last = normalize_failure(exc, attempt=3, policy=policy, now_ns=456)
    assert last.category == record.category
    assert last.retryable is False
    assert last.attempt == 3


def test_handler_exceptions_are_streamsched_errors() -> None:
    assert issubclass(Retryable, StreamschedError)
    assert issubclass(Terminal, StreamschedError)
    assert not issubclass(Retryable, Terminal) and not issubclass(Terminal, Retryable)


def test_normalize_without_aiokafka(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the lazy import raise ImportError.
    monkeypatch.setitem(sys.modules, "aiokafka.errors", None)
    policy = RetryPolicy()
    assert normalize_failure(OSError(), attempt=1, policy=policy, now_ns=0).cause_kind == "transport"
    assert normalize_failure(RuntimeError(), attempt=1, policy=policy, now_ns=0).cause_kind == "internal"


def test_normalize_rejects_bad_attempt() -> None:
    with pytest.raises(BoundExceeded):
        normalize_failure(ValueError(), attempt=0, policy=RetryPolicy(), now_ns=0)
