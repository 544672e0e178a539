"""The overlap policy (streamsched.model.overlap): which due boundaries fire while a run is
unresolved, and a state machine over ticks and results that checks its accounting."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamsched.errors import ConfigError
from streamsched.model.overlap import IDLE, OVERLAPS, Running, admit, check_overlap, release, resolved


def test_allow_fires_everything_and_tracks_nothing() -> None:
    out = admit("allow", IDLE, [1, 2, 3])
    assert (out.fire, out.skipped, out.row, out.running) == ((1, 2, 3), (), None, IDLE)


def test_skip_fires_the_first_and_skips_the_rest_with_one_history_row() -> None:
    out = admit("skip", IDLE, [1, 2, 3])
    assert (out.fire, out.skipped, out.row) == ((1,), (2, 3), 2)
    assert out.running == Running(pending_ns=1, skips=2)
    # Still unresolved at the next tick: skipped again, without another row.
    later = admit("skip", out.running, [4])
    assert (later.fire, later.skipped, later.row, later.running.skips) == ((), (4,), None, 3)
    # Resolved: the next boundary fires and its own first skip gets a row again.
    after = admit("skip", resolved(later.running, 1), [5, 6])
    assert (after.fire, after.skipped, after.row) == ((5,), (6,), 6)


def test_buffer_one_holds_the_first_and_releases_it_when_the_run_resolves() -> None:
    out = admit("buffer_one", Running(pending_ns=1), [2, 3, 4])
    assert (out.fire, out.skipped, out.row) == ((), (3, 4), 3)
    assert out.running == Running(pending_ns=1, buffered_ns=2, skips=2)
    assert release(out.running) == (None, out.running)  # nothing fires while the run is pending
    held, running = release(resolved(out.running, 1))
    assert held == 2 and running == Running(pending_ns=2)


def test_a_result_of_another_occurrence_resolves_nothing() -> None:
    running = Running(pending_ns=5, buffered_ns=6)
    assert resolved(running, 4) is running


def test_overlap_values_are_checked() -> None:
    assert [check_overlap(v) for v in OVERLAPS] == ["allow", "skip", "buffer_one"]
    with pytest.raises(ConfigError, match="overlap must be one of allow, skip, buffer_one"):
        check_overlap("queue")


class OverlapMachine(RuleBasedStateMachine):
    """Ticks bring due boundaries (ascending), results resolve runs; after every step: each
    boundary is fired, held or skipped exactly once, and never do two scheduled runs overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = "skip"
        self.running = IDLE
        self.next_t = 1
        self.due: list[int] = []
        self.fired: list[int] = []
        self.skipped: list[int] = []
        self.unresolved: set[int] = set()

    @rule(policy=st.sampled_from(["skip", "buffer_one"]))
    def choose(self, policy: str) -> None:
        if not self.due:  # a policy is fixed for a definition version: chosen before anything is due
            self.policy = policy

    @rule(n=st.integers(0, 4))
    def tick(self, n: int) -> None:
        held, self.running = release(self.running)
        if held is not None:
            self.fire(held)
        boundaries = list(range(self.next_t, self.next_t + n))
        self.next_t += n
        self.due += boundaries
        out = admit(self.policy, self.running, boundaries)  # type: ignore[arg-type]
        for t in out.fire:
            self.fire(t)
        self.skipped += out.skipped
        assert out.row is None or out.row in out.skipped
        self.running = out.running

    def fire(self, t: int) -> None:
        assert not self.unresolved, f"{t} fired while {self.unresolved} had not resolved"
        self.fired.append(t)
        self.unresolved.add(t)

    @precondition(lambda self: bool(self.unresolved))
    @rule()
    def result(self) -> None:
        t = self.unresolved.pop()
        self.running = resolved(self.running, t)

    @invariant()
    def every_boundary_is_accounted_for_once(self) -> None:
        held = [self.running.buffered_ns] if self.running.buffered_ns is not None else []
        assert sorted(self.fired + self.skipped + held) == self.due
        assert self.running.pending_ns in (None, *self.unresolved)
        if self.policy == "skip":
            assert not held


TestOverlapMachine = OverlapMachine.TestCase
