"""Circuit breaker policy and state machine (pure: no I/O, no clock reads).

A downstream that is down makes every call fail. Without a breaker each item spends its retry
budget on the outage and is dead-lettered, and an hour's outage becomes thousands of dead letters
to re-drive. A breaker watches the calls' results, and once too many fail it *opens*: the owner
stops taking new claims until ``open_s`` has passed, then lets a few probe calls through
(*half-open*); enough probes succeeding close it again, one failing opens it again.

States::

    CLOSED ──failure ratio >= threshold over the window (>= minimum_calls)──▶ OPEN
    OPEN ──open_s passed (asked by admit/probe)──▶ HALF_OPEN
    HALF_OPEN ──a probe fails──▶ OPEN          HALF_OPEN ──half_open_calls probes succeed──▶ CLOSED

Only *transient* failures count against the downstream (a timeout, a transport error, a
``Retryable`` the command raised). A permanent failure means the downstream answered, so it counts
as a call that went through. The window is kept as per-second buckets: at most ``window_s + 1``
entries, whatever the call rate.

Modelled on resilience4j's count of a sliding time window, with temporalio's frozen policy
objects (the policy sits beside :class:`~streamsched.model.retry.RetryPolicy`).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from streamsched.errors import ConfigError, StreamschedError
from streamsched.model.limits import is_real

__all__ = ["MAX_OPEN_S", "MAX_WINDOW_S", "Breaker", "BreakerOpen", "BreakerPolicy", "BreakerState"]

MAX_WINDOW_S = 3600
"""Longest failure window (one bucket per second is kept)."""
MAX_OPEN_S = 3600.0
"""Longest time a breaker stays open before it probes."""
MAX_PROBES = 100
_NS = 1_000_000_000


class BreakerOpen(StreamschedError):
    """A call refused because its breaker is open (or every probe slot is taken). The item is
    not charged an attempt: it waits until ``retry_at_ns`` (monotonic) and is delivered again."""

    kind = "breaker_open"

    def __init__(self, scope: str, retry_at_ns: int) -> None:
        super().__init__(f"circuit breaker {scope} is open")
        self.scope = scope
        self.retry_at_ns = retry_at_ns


class BreakerState(enum.IntEnum):
    """Also the value of the ``breaker_state`` gauge."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a breaker opens and how it closes again.

    Attributes:
        failure_ratio: Share of calls in the window that failed transiently at which it opens;
            in (0, 1].
        window_s: Length of the window of recent calls, whole seconds in 1..3600.
        minimum_calls: Calls the window must hold before the ratio is judged (a single failure
            out of one call opens nothing); 1..1,000,000.
        open_s: How long it stays open before probing; > 0 and at most 3600.
        half_open_calls: Probe calls let through while half-open, and how many must succeed
            to close it; 1..100.
    """

    failure_ratio: float = 0.5
    window_s: int = 30
    minimum_calls: int = 20
    open_s: float = 30.0
    half_open_calls: int = 3

    def __post_init__(self) -> None:
        if not is_real(self.failure_ratio) or not 0 < self.failure_ratio <= 1:
            raise ConfigError("breaker failure_ratio must be a number in (0, 1]")
        if type(self.window_s) is not int or not 1 <= self.window_s <= MAX_WINDOW_S:
            raise ConfigError(f"breaker window_s must be a whole number of seconds in 1..{MAX_WINDOW_S}")
        if type(self.minimum_calls) is not int or not 1 <= self.minimum_calls <= 1_000_000:
            raise ConfigError("breaker minimum_calls must be an integer in 1..1000000")
        if not is_real(self.open_s) or not 0 < self.open_s <= MAX_OPEN_S:
            raise ConfigError(f"breaker open_s must be a number of seconds in (0, {MAX_OPEN_S:.0f}]")
        if type(self.half_open_calls) is not int or not 1 <= self.half_open_calls <= MAX_PROBES:
            raise ConfigError(f"breaker half_open_calls must be an integer in 1..{MAX_PROBES}")


class Breaker:
    """One breaker's state; every method takes the caller's monotonic clock in ns."""

    __slots__ = ("_buckets", "_calls", "_failures", "_open_until", "_probes", "_successes",
                 "opened", "policy", "scope", "state")

    def __init__(self, policy: BreakerPolicy, scope: str) -> None:
        self.policy = policy
        self.scope = scope
        self.state = BreakerState.CLOSED
        self.opened = 0
        """Times it opened (a counter the worker exports)."""
        self._buckets: deque[list[int]] = deque()  # [second, calls, failures]
        self._calls = self._failures = 0
        self._open_until = 0
        self._probes = 0  # probe calls running
        self._successes = 0  # probes that succeeded since it half-opened

    # --- asked before work is taken or a call made ------------------------------------------------

    def _tick(self, now_ns: int) -> None:
        if self.state is BreakerState.OPEN and now_ns >= self._open_until:
            self.state = BreakerState.HALF_OPEN
            self._probes = self._successes = 0

    def admits(self, now_ns: int) -> bool:
        """Whether new work may be taken now (closed, or half-open with a probe slot free)."""
        self._tick(now_ns)
        if self.state is BreakerState.CLOSED:
            return True
        return self.state is BreakerState.HALF_OPEN and self._probes < self.policy.half_open_calls

    def reopens_at(self, now_ns: int) -> int:
        """When work refused now should be offered again (monotonic ns)."""
        self._tick(now_ns)
        if self.state is BreakerState.OPEN:
            return self._open_until
        # Half-open with every probe slot taken: a probe ends within the open time at the latest.
        return now_ns + min(_NS, int(self.policy.open_s * _NS))

    def begin(self, now_ns: int) -> bool:
        """A call is about to be made: True if it is a probe (a slot taken while half-open),
        False if closed; :class:`BreakerOpen` if it may not be made. Every call let through must
        be followed by exactly one :meth:`end` with the flag returned here."""
        if not self.admits(now_ns):
            raise BreakerOpen(self.scope, self.reopens_at(now_ns))
        if self.state is BreakerState.HALF_OPEN:
            self._probes += 1
            return True
        return False

    # --- told after a call ------------------------------------------------------------------------

    def end(self, now_ns: int, *, failed: bool, probe: bool, counted: bool = True) -> None:
        """The call :meth:`begin` let through ended; ``failed``: a transient failure; ``probe``:
        what :meth:`begin` returned; ``counted``: False for a call that says nothing of the
        downstream (cancelled by a stop; refused by another breaker): only its slot is freed."""
        if probe:
            self._probes = max(0, self._probes - 1)
            if not counted:
                return
            if self.state is not BreakerState.HALF_OPEN:
                return  # opened again by another probe meanwhile: this one says nothing new
            if failed:
                self._open(now_ns)
                return
            self._successes += 1
            if self._successes >= self.policy.half_open_calls:
                self.state = BreakerState.CLOSED
                self._buckets.clear()
                self._calls = self._failures = 0
            return
        if not counted or self.state is not BreakerState.CLOSED:
            return  # (or a call that began before it opened)
        self._record(now_ns // _NS, failed)
        p = self.policy
        if self._calls >= p.minimum_calls and self._failures >= p.failure_ratio * self._calls:
            self._open(now_ns)

    def _record(self, second: int, failed: bool) -> None:
        buckets = self._buckets
        horizon = second - self.policy.window_s
        while buckets and buckets[0][0] <= horizon:
            _, calls, failures = buckets.popleft()
            self._calls -= calls
            self._failures -= failures
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        last = buckets[-1]
        last[1] += 1
        self._calls += 1
        if failed:
            last[2] += 1
            self._failures += 1

    def _open(self, now_ns: int) -> None:
        self.state = BreakerState.OPEN
        self.opened += 1
        self._open_until = now_ns + int(self.policy.open_s * _NS)
        self._buckets.clear()
        self._calls = self._failures = 0
        self._probes = self._successes = 0

    def snapshot(self, now_ns: int) -> dict[str, object]:
        """What status shows: the state, the calls and failures in the window, and for an open
        breaker the seconds until it probes."""
        self._tick(now_ns)
        out: dict[str, object] = {"state": self.state.name.lower(), "calls": self._calls,
                                  "failures": self._failures, "opened": self.opened}
        if self.state is BreakerState.OPEN:
            out["probes_in_s"] = round((self._open_until - now_ns) / _NS, 3)
        return out
