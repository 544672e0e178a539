"""Commit watermarks (streamsched.worker.offsets): unit tests and a stateful hypothesis model.

The model plays intake and turn against two logs (the transition partition, resolved in order,
and the delay partition, resolved out of order), both holding data records and transaction
markers that take an offset but are never handed out. It checks the three properties the
worker's exactly-once argument needs: a watermark never passes an unresolved offset, never moves
backwards, and reaches the end of both logs once everything consumed is resolved.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from streamsched.worker.offsets import Offsets, Span

# ------------------------------------------------------------------------------------- unit tests


def test_fresh_offsets_commit_nothing() -> None:
    o = Offsets()
    assert o.after(None) == (None, None)
    assert not o.unsent()


def test_transition_watermark_follows_resolved_batches_and_never_regresses() -> None:
    o = Offsets()
    o.note_offered(4)
    assert o.after(Span(5)) == (5, None)  # what the resolving transaction would commit
    assert o.after(None) == (None, None)  # ... but nothing is resolved yet
    o.resolve(Span(5))
    assert o.after(None) == (5, None) and o.unsent()
    o.resolve(Span(None))  # a batch of re-driven records only leaves the transition mark alone
    assert o.after(Span(3)) == (5, None)
    o.t_sent = 5
    assert not o.unsent()


def test_delay_watermark_is_the_lowest_outstanding_offset() -> None:
    o = Offsets()
    for off in (10, 11, 12):
        o.note_delayed(off)
    assert o.after(None) == (None, 10)
    assert o.after(Span(None, [11, 12])) == (None, 10)  # 10 is still outstanding
    o.resolve(Span(None, [11]))
    assert o.after(None) == (None, 10)
    o.resolve(Span(None, [10]))
    assert o.after(None) == (None, 12)
    o.resolve(Span(None, [12]))
    assert o.after(None) == (None, 13)


def test_skip_markers_steps_over_trailing_markers_only_once_settled() -> None:
    o = Offsets()
    o.note_offered(4)
    o.skip_markers(7, None)  # offset 4 is offered but unresolved: the gap may hold it
    assert o.after(None) == (None, None)
    o.resolve(Span(5))
    o.note_offered(5)  # a second record arrives, offered but not resolved
    o.skip_markers(8, None)
    assert o.after(None) == (5, None)
    o.resolve(Span(6))
    o.skip_markers(8, None)  # settled: 6 and 7 can only be markers
    assert o.after(None) == (8, None)
    o.skip_markers(6, None)  # an older position never moves the mark back
    assert o.after(None) == (8, None)


def test_skip_markers_on_the_delay_partition_waits_for_outstanding_records() -> None:
    o = Offsets()
    o.note_delayed(3)
    o.skip_markers(None, 6)
    assert o.after(None) == (None, 3)
    o.resolve(Span(None, [3]))
    assert o.after(None) == (None, 4)
    o.skip_markers(None, 6)
    assert o.after(None) == (None, 6)


@pytest.mark.parametrize("partition", ["transition", "delay"])
def test_marker_only_tail_of_a_new_owner_is_stepped_over(partition: str) -> None:
    # The previous owner committed up to its last record; a COMMIT marker follows at offset 9.
    # The new owner consumes from 9, receives nothing, and its position becomes 10: the gap can
    # only hold markers, so the committed offset must reach 10 (else the lag stays 1 forever).
    o = Offsets()
    o.seed(9, 9)  # the owner starts from the committed offsets (issue 7 item 4n)
    if partition == "transition":
        o.skip_markers(10, None)
        assert o.after(None)[0] == 10
    else:
        o.skip_markers(None, 10)
        assert o.after(None)[1] == 10


# ------------------------------------------------------------------------------- stateful model


class WatermarkMachine(RuleBasedStateMachine):
    """Intake, turn and commits of one partition against logs with transaction markers."""

    def __init__(self) -> None:
        super().__init__()
        self.o = Offsets()
        self.o.seed(0, 0)  # a new owner starts from the committed offsets (here: the beginning)
        # Each log entry is True for a data record, False for a transaction marker.
        self.logs: dict[str, list[bool]] = {"t": [], "d": []}
        self.pos = {"t": 0, "d": 0}
        self.t_unbatched: list[int] = []  # offered, waiting in the runner's queue (FIFO)
        self.d_unbatched: list[int] = []  # noted, waiting in the due index (any order)
        self.batches: list[Span] = []  # claimed and executing, resolved in creation order
        self.resolved: dict[str, set[int]] = {"t": set(), "d": set()}
        self.last: tuple[int | None, int | None] = (None, None)

    # --- the logs grow (other producers' records and transaction markers) ---------------------

    @rule(log=st.sampled_from(["t", "d"]), entries=st.lists(st.booleans(), min_size=1, max_size=6))
    def append(self, log: str, entries: list[bool]) -> None:
        self.logs[log].extend(entries)

    # --- intake -------------------------------------------------------------------------------

    def _fetch(self, log: str, limit: int) -> list[int]:
        """A read_committed fetch: up to ``limit`` records; the position passes markers unless
        the limit stopped it right after a record."""
        entries, out = self.logs[log], []
        while self.pos[log] < len(entries) and len(out) < limit:
            off = self.pos[log]
            self.pos[log] += 1
            if entries[off]:
                out.append(off)
        return out

    @rule(limit=st.integers(1, 5))
    def fetch_transition(self, limit: int) -> None:
        recs = self._fetch("t", limit)
        if recs:
            self.o.note_offered(recs[-1])
            self.t_unbatched.extend(recs)

    @rule(limit=st.integers(1, 5))
    def fetch_delay(self, limit: int) -> None:
        for off in self._fetch("d", limit):
            self.o.note_delayed(off)
            self.d_unbatched.append(off)

    @rule()
    def skip_markers(self) -> None:
        self.o.skip_markers(self.pos["t"], self.pos["d"])

    # --- the turn -------------------------------------------------------------------------------

    @rule(n_t=st.integers(0, 4), picks=st.lists(st.integers(0, 50), max_size=4, unique=True))
    def prepare(self, n_t: int, picks: list[int]) -> None:
        """A batch of the next transition records and any due delay records (out of order)."""
        t = self.t_unbatched[:n_t]
        del self.t_unbatched[:n_t]
        chosen = sorted({i % len(self.d_unbatched) for i in picks}, reverse=True) if self.d_unbatched else []
        delayed = [self.d_unbatched.pop(i) for i in chosen]
        if t or delayed:
            self.batches.append(Span(t[-1] + 1 if t else None, tuple(delayed)))

    @rule()
    def resolve(self) -> None:
        if not self.batches:
            return
        batch = self.batches.pop(0)
        # What the resolving transaction commits counts this batch as resolved.
        candidate = self.o.after(batch)
        for off in range(batch.next_offset or 0):
            if self.logs["t"][off]:
                self.resolved["t"].add(off)
        self.resolved["d"].update(batch.delayed)
        self._check(candidate)
        self.o.resolve(batch)
        assert self.o.after(None) == candidate

    @rule()
    def drain(self) -> None:
        """Consume, run and resolve everything, then step over markers: both marks reach the end."""
        while self.pos["t"] < len(self.logs["t"]) or self.pos["d"] < len(self.logs["d"]):
            self.fetch_transition(5)
            self.fetch_delay(5)
        self.prepare(len(self.t_unbatched), list(range(len(self.d_unbatched))))
        while self.batches:
            self.resolve()
        self.skip_markers()
        t, d = self.o.after(None)
        # Seeded at the start, both marks reach the log's end even when only markers were read.
        assert t == len(self.logs["t"])
        assert d == len(self.logs["d"])

    # --- invariants -----------------------------------------------------------------------------

    def _check(self, marks: tuple[int | None, int | None]) -> None:
        for log, mark in zip(("t", "d"), marks, strict=True):
            if mark is None:
                continue
            # Never past an unresolved record, nor past what the consumer has read.
            assert mark <= self.pos[log]
            unresolved = [off for off in range(mark) if self.logs[log][off] and off not in self.resolved[log]]
            assert unresolved == [], f"{log} mark {mark} passes unresolved {unresolved}"
        for before, now in zip(self.last, marks, strict=True):
            assert before is None or (now is not None and now >= before), "a watermark moved back"

    @invariant()
    def watermarks_are_safe_and_monotonic(self) -> None:
        marks = self.o.after(None)
        self._check(marks)
        self.last = marks


TestWatermarks = WatermarkMachine.TestCase
TestWatermarks.settings = settings(max_examples=100, stateful_step_count=30, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])
