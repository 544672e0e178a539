"""Step 1's lease rule on its own (:class:`streamsched.worker.selection.Selector`): another owner's
claim is never taken before its lease ends in real time, however far (within the allowed skew)
the observer's wall clock runs from the claimant's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.model.event import TransitionEvent
from streamsched.model.limits import MAX_CLOCK_SKEW_S
from streamsched.worker.selection import MAX_WATCHED, Selector
from tests.worker.test_turn_unit import NOW, World, event

S = 1_000_000_000
DURATION = 30 * S


def due_event(target: str = "inv-1") -> TransitionEvent:
    """Due an hour ago: due for every observer clock of these tests."""
    return event(target, due=NOW - 3600 * S)


class Clocks:
    """Real time (ns since NOW) and the observer's clocks: its wall clock off by ``skew_ns``."""

    def __init__(self, skew_ns: int) -> None:
        self.real = 0
        self.skew_ns = skew_ns

    def wall(self) -> int:
        return NOW + self.real + self.skew_ns

    def monotonic(self) -> int:
        return 5 * S + self.real  # any origin: only differences count


def selector(w: World, clocks: Clocks, held: ClaimState) -> Selector:
    return Selector(w.sched, 0, owner="owner-a", metrics=Metrics("billing"), clock=clocks.wall,
                    current=lambda _identity: held, monotonic=clocks.monotonic)


def verdict(sel: Selector, rec: object) -> int | None:
    """None when the item leads (its claim would be taken now), else until when it is parked."""
    [item] = sel.select(sel.prepare([rec]), partitions=1).items  # type: ignore[list-item]
    return item.park_until_ns


def claimed_by_b(w: World, *, at_real: int, duration: int = DURATION) -> ClaimState:
    """owner-b's claim taken at real time ``at_real`` by a correct clock."""
    return ClaimState(w.identity(due_event())).acquire(owner="owner-b", now_ns=NOW + at_real,
                                                   duration_ns=duration, expected_revision=0)


@given(skew_s=st.integers(-int(MAX_CLOCK_SKEW_S) + 1, int(MAX_CLOCK_SKEW_S) - 1),
       seen_after_s=st.integers(0, 60), steps_s=st.lists(st.integers(1, 40), max_size=6))
def test_no_clock_within_the_allowed_skew_takes_a_lease_before_it_ends(
        skew_s: int, seen_after_s: int, steps_s: list[int]) -> None:
    w = World()
    held = claimed_by_b(w, at_real=0)
    clocks = Clocks(skew_s * S)
    clocks.real = seen_after_s * S  # the observer first sees the claim this long after it was taken
    sel = selector(w, clocks, held)
    rec = w.produce(due_event())
    for step in [0, *steps_s]:
        clocks.real += step * S
        until = verdict(sel, rec)
        if until is None:
            assert clocks.real >= DURATION, f"taken {clocks.real / S} s into a {DURATION / S} s lease"
            return
        assert until > clocks.wall() or clocks.real < DURATION
    clocks.real = max(clocks.real, seen_after_s * S) + DURATION + max(0, -skew_s) * S
    assert verdict(sel, rec) is None, "a lease that ended for every clock is taken over"


def test_a_fast_clock_waits_a_whole_duration_from_first_sight() -> None:
    w = World()
    held = claimed_by_b(w, at_real=0)
    clocks = Clocks(300 * S)  # five minutes ahead: by its wall clock the lease ended long ago
    sel = selector(w, clocks, held)
    rec = w.produce(due_event())
    clocks.real = 2 * S
    assert verdict(sel, rec) == clocks.wall() + DURATION  # first seen 2 s in
    clocks.real = 31 * S
    assert verdict(sel, rec) == clocks.wall() + S  # 29 s watched: one more second
    clocks.real = 32 * S
    assert verdict(sel, rec) is None


def test_a_slow_clock_waits_for_the_lease_end_by_its_own_reading() -> None:
    w = World()
    held = claimed_by_b(w, at_real=0)
    clocks = Clocks(-300 * S)
    sel = selector(w, clocks, held)
    rec = w.produce(due_event())
    assert verdict(sel, rec) == held.lease_expires_ns
    clocks.real = 329 * S
    assert verdict(sel, rec) == held.lease_expires_ns
    clocks.real = 330 * S
    assert verdict(sel, rec) is None


def test_a_lease_that_ended_beyond_the_allowed_skew_is_taken_at_once() -> None:
    w = World()
    held = claimed_by_b(w, at_real=0)
    clocks = Clocks(0)
    clocks.real = DURATION + int(MAX_CLOCK_SKEW_S * S)
    assert verdict(selector(w, clocks, held), w.produce(due_event())) is None


def test_a_new_claim_of_the_identity_is_watched_afresh_and_watches_are_bounded() -> None:
    w = World()
    first = claimed_by_b(w, at_real=0)
    clocks = Clocks(300 * S)
    current = [first]
    sel = Selector(w.sched, 0, owner="owner-a", metrics=Metrics("billing"), clock=clocks.wall,
                   current=lambda _identity: current[0], monotonic=clocks.monotonic)
    rec = w.produce(due_event())
    assert verdict(sel, rec) is not None
    clocks.real = 20 * S
    current[0] = ClaimState(first.identity, first.status, "owner-c", first.fence + 1,
                            NOW + 20 * S + DURATION, first.ordinal + 1, first.revision + 1)
    assert verdict(sel, rec) == clocks.wall() + DURATION  # owner-c's claim: a new watch
    for n in range(MAX_WATCHED + 10):
        ev = due_event(f"t-{n}")
        current[0] = ClaimState(w.identity(ev), ClaimStatus.CLAIMED, "owner-b", 1,
                                NOW + clocks.real + DURATION, 1, 1)
        assert verdict(sel, w.produce(ev)) is not None
    assert len(sel._watched) == MAX_WATCHED
