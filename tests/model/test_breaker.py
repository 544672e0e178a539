"""The circuit breaker policy and state machine (pure; clock passed in)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from streamsched.errors import ConfigError
from streamsched.model.breaker import Breaker, BreakerOpen, BreakerPolicy, BreakerState

S = 1_000_000_000
POLICY = BreakerPolicy(failure_ratio=0.5, window_s=10, minimum_calls=4, open_s=5.0, half_open_calls=2)


@pytest.mark.parametrize("kwargs", [
    {"failure_ratio": 0}, {"failure_ratio": 1.5}, {"failure_ratio": float("nan")}, {"failure_ratio": True},
    {"window_s": 0}, {"window_s": 2.5}, {"window_s": 3601},
    {"minimum_calls": 0}, {"minimum_calls": 1.0},
    {"open_s": 0}, {"open_s": -1}, {"open_s": float("inf")}, {"open_s": 3601}, {"open_s": 10**400},
    {"half_open_calls": 0}, {"half_open_calls": 101},
])
def test_bad_policy_values_are_refused_with_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]


def _calls(b: Breaker, now: int, *, failed: bool, n: int) -> None:
    for _ in range(n):
        probe = b.begin(now)
        b.end(now, failed=failed, probe=probe)


def test_it_opens_only_past_the_ratio_with_enough_calls() -> None:
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=True, n=3)
    assert b.state is BreakerState.CLOSED  # 3 calls < minimum_calls
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=False, n=3)
    _calls(b, 0, failed=True, n=2)
    assert b.state is BreakerState.CLOSED  # 2 of 5 failed: < 0.5
    _calls(b, 0, failed=True, n=1)  # 3 of 6 failed: >= 0.5
    assert b.state is BreakerState.OPEN and b.opened == 1
    with pytest.raises(BreakerOpen) as refused:
        b.begin(1 * S)
    assert refused.value.retry_at_ns == 5 * S and refused.value.kind == "breaker_open"
    assert not b.admits(5 * S - 1)


def test_failures_outside_the_window_are_forgotten() -> None:
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=True, n=3)
    _calls(b, 11 * S, failed=False, n=3)
    _calls(b, 11 * S, failed=True, n=1)  # the three old failures left the 10 s window: 1 of 4
    assert b.state is BreakerState.CLOSED
    assert b.snapshot(11 * S)["calls"] == 4


def test_half_open_lets_probes_through_and_closes_after_enough_succeed() -> None:
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=True, n=4)
    assert b.begin(5 * S) is True and b.state is BreakerState.HALF_OPEN
    assert b.begin(5 * S) is True
    with pytest.raises(BreakerOpen):
        b.begin(5 * S)  # both probe slots taken
    b.end(5 * S, failed=False, probe=True)
    assert b.state is BreakerState.HALF_OPEN
    b.end(5 * S, failed=False, probe=True)
    assert b.state is BreakerState.CLOSED and b.admits(5 * S)


def test_a_failed_probe_opens_it_again_for_the_whole_open_time() -> None:
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=True, n=4)
    probe = b.begin(6 * S)
    b.end(6 * S, failed=True, probe=probe)
    assert b.state is BreakerState.OPEN and b.opened == 2
    assert b.reopens_at(6 * S) == 11 * S


def test_a_cancelled_probe_frees_its_slot_and_says_nothing() -> None:
    b = Breaker(POLICY, "charge")
    _calls(b, 0, failed=True, n=4)
    for _ in range(2):
        probe = b.begin(5 * S)
        b.end(5 * S, failed=False, probe=probe, counted=False)
    assert b.state is BreakerState.HALF_OPEN and b.admits(5 * S)


class BreakerMachine(RuleBasedStateMachine):
    """Whatever the calls do: probes never exceed their slots, an open breaker admits nothing
    before its time, and the window holds at most window_s + 1 buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.b = Breaker(POLICY, "x")
        self.now = 0
        self.running: list[bool] = []

    @rule(dt=st.integers(0, 3 * S))
    def time_passes(self, dt: int) -> None:
        self.now += dt

    @rule()
    def call_begins(self) -> None:
        # Asked after the breaker has seen the time (reopens_at moves it on): open at its
        # boundary would read OPEN before and HALF_OPEN after, and the call may then begin.
        self.b.reopens_at(self.now)
        was_open = self.b.state is BreakerState.OPEN
        try:
            self.running.append(self.b.begin(self.now))
        except BreakerOpen:
            return
        assert not was_open

    @rule(failed=st.booleans(), counted=st.booleans())
    def call_ends(self, failed: bool, counted: bool) -> None:
        if self.running:
            self.b.end(self.now, failed=failed, probe=self.running.pop(0), counted=counted)

    @invariant()
    def bounded(self) -> None:
        assert self.b._probes <= POLICY.half_open_calls
        assert len(self.b._buckets) <= POLICY.window_s + 1
        assert 0 <= self.b._failures <= self.b._calls


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
