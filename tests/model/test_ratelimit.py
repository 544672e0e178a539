"""The pacer of one owner's share of a group-wide rate, and the rate check (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched import App, Selection, external_command
from streamsched.errors import ConfigError
from streamsched.model.ratelimit import BURST_S, Pacer, check_rate

S = 1_000_000_000


@pytest.mark.parametrize("rate", [0, -1, -0.5, float("nan"), float("inf"), True, "200", 2_000_000, 10**400])
def test_a_rate_that_is_not_a_positive_finite_number_is_refused(rate: object) -> None:
    with pytest.raises(ConfigError, match="rate must be a positive number"):
        check_rate(rate, "command")
    with pytest.raises(ConfigError):
        external_command(rate=rate)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        App("a").scheduler(topic="t", selection=Selection("s"), commands=[], rate=rate)(_noop)


async def _noop(turn: object) -> None:
    return None


def test_calls_as_fast_as_allowed_come_exactly_at_the_rate() -> None:
    pacer, now, starts = Pacer(), 0, []
    for _ in range(1000):
        now += pacer.reserve(now, 200.0)
        starts.append(now)
    assert starts[-1] - starts[0] == pytest.approx(999 * S / 200, rel=1e-6)


def test_a_new_share_takes_effect_from_the_next_call() -> None:
    pacer, now = Pacer(), 0
    for _ in range(10):
        now += pacer.reserve(now, 10.0)
    before = now
    for _ in range(10):
        now += pacer.reserve(now, 5.0)  # a rebalance halved this owner's share
    # The slot already promised at the old share, then nine at the new one.
    assert now - before == pytest.approx(S / 10 + 9 * S / 5, rel=1e-6)


@given(gaps=st.lists(st.integers(0, 2 * S), min_size=1, max_size=300),
       rate=st.floats(1.0, 1000.0), window=st.integers(1, 5))
def test_no_window_holds_more_than_its_rate_plus_the_burst(gaps: list[int], rate: float, window: int) -> None:
    """Whatever the demand (callers arriving at any times), the calls started in any window of
    ``window`` seconds are at most ``rate x (window + BURST_S) + 1``."""
    pacer, now, starts = Pacer(), 0, []
    for gap in gaps:
        now += gap
        starts.append(now + pacer.reserve(now, rate))
    starts.sort()
    bound = rate * (window + BURST_S) + 1
    j = 0
    for i, t in enumerate(starts):
        while starts[j] < t - window * S:
            j += 1
        assert i - j + 1 <= bound + 1e-9
