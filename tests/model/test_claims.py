"""Unit and stateful tests of the pure claim state machine (streamsched.claims)."""

from __future__ import annotations

import copy
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streamsched.errors import ClaimError, IllegalTransition, LeaseHeld, RevisionConflict, StaleFence
from streamsched.model.claims import CANCELLED_KIND, ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.model.identity import IdentityParts, business_identity

IDENT = business_identity(IdentityParts("sched", "topic", "sel", 1, "tenant", ("k",), "run"))
IDENT2 = business_identity(IdentityParts("sched", "topic", "sel", 2, "tenant", ("k",), "run"))
LEASE = 1_000


def ok(fence: int, at_ns: int = 5, kind: OutcomeKind = OutcomeKind.SUCCEEDED) -> Outcome:
    return Outcome(kind=kind, fence=fence, at_ns=at_ns, events=2, digest=b"\x01\x02")


def fresh() -> ClaimState:
    return ClaimState(IDENT)


def claimed(owner: str = "A", now: int = 0) -> ClaimState:
    return fresh().acquire(owner=owner, now_ns=now, duration_ns=LEASE, expected_revision=0)


def stored() -> ClaimState:
    s = claimed()
    return s.store_outcome(fence=s.fence, expected_revision=s.revision, outcome=ok(s.fence))


# --- happy path ----------------------------------------------------------------------------------


def test_initial_state() -> None:
    s = fresh()
    assert (s.status, s.owner, s.fence, s.ordinal, s.revision, s.outcome) == (
        ClaimStatus.FREE, "", 0, 0, 0, None)
    assert not s.lease_active(0)


def test_acquire_from_free() -> None:
    s = claimed(now=100)
    assert s.status is ClaimStatus.CLAIMED
    assert (s.owner, s.fence, s.ordinal, s.revision, s.lease_expires_ns) == ("A", 1, 1, 1, 100 + LEASE)
    assert s.lease_active(100) and s.lease_active(100 + LEASE - 1)
    assert not s.lease_active(100 + LEASE)


def test_store_outcome_then_release_keeps_outcome() -> None:
    s = stored()
    assert s.status is ClaimStatus.OUTCOME_STORED
    assert s.outcome == ok(1) and s.revision == 2 and s.fence == 1
    r = s.release(fence=1, expected_revision=2)
    assert r.status is ClaimStatus.RELEASED
    assert (r.owner, r.lease_expires_ns, r.revision, r.fence, r.ordinal) == ("", 0, 3, 1, 1)
    assert r.outcome == ok(1)


def test_release_without_outcome() -> None:
    s = claimed()
    r = s.release(fence=1, expected_revision=1)
    assert r.status is ClaimStatus.RELEASED and r.outcome is None and r.revision == 2


def test_reacquire_after_release_keeps_outcome_and_mints_new_fence() -> None:
    r = stored().release(fence=1, expected_revision=2)
    a = r.acquire(owner="B", now_ns=10, duration_ns=LEASE, expected_revision=3)
    assert a.status is ClaimStatus.CLAIMED
    assert (a.owner, a.fence, a.ordinal, a.revision) == ("B", 2, 2, 4)
    assert a.outcome == ok(1)


def test_same_owner_may_reacquire_unexpired_lease() -> None:
    s = claimed("A", now=0)
    s2 = s.acquire(owner="A", now_ns=10, duration_ns=LEASE, expected_revision=1)
    assert (s2.fence, s2.ordinal, s2.revision, s2.lease_expires_ns) == (2, 2, 2, 10 + LEASE)
    # the old fence is now stale even for the same owner
    with pytest.raises(StaleFence):
        s2.release(fence=1, expected_revision=2)


def test_states_are_immutable() -> None:
    s = claimed()
    with pytest.raises(FrozenInstanceError):
        s.fence = 99  # type: ignore[misc]


# --- typed refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("presented", [0, 2, -1, 100])
def test_revision_conflict_on_acquire(presented: int) -> None:
    s = claimed()
    before = copy.deepcopy(s)
    with pytest.raises(RevisionConflict) as ei:
        s.acquire(owner="A", now_ns=0, duration_ns=LEASE, expected_revision=presented)
    assert ei.value.presented == presented and ei.value.expected == 1
    assert ei.value.identity == IDENT
    assert s == before


def test_revision_conflict_on_store_and_release() -> None:
    s = claimed()
    with pytest.raises(RevisionConflict) as ei:
        s.store_outcome(fence=1, expected_revision=0, outcome=ok(1))
    assert (ei.value.presented, ei.value.expected) == (0, 1)
    with pytest.raises(RevisionConflict) as ei2:
        s.release(fence=1, expected_revision=7)
    assert (ei2.value.presented, ei2.value.expected) == (7, 1)


def test_revision_checked_before_everything_else() -> None:
    # wrong revision AND stale fence AND illegal state: revision wins
    with pytest.raises(RevisionConflict):
        fresh().release(fence=99, expected_revision=5)
    with pytest.raises(RevisionConflict):
        claimed().acquire(owner="", now_ns=0, duration_ns=LEASE, expected_revision=0)


def test_stale_fence_on_store_outcome() -> None:
    s = claimed("A").acquire(owner="A", now_ns=1, duration_ns=LEASE, expected_revision=1)
    with pytest.raises(StaleFence) as ei:
        s.store_outcome(fence=1, expected_revision=2, outcome=ok(1))
    assert (ei.value.presented, ei.value.current, ei.value.identity) == (1, 2, IDENT)


def test_stale_fence_on_release() -> None:
    s = claimed("A", now=0).acquire(owner="B", now_ns=LEASE, duration_ns=LEASE, expected_revision=1)
    with pytest.raises(StaleFence) as ei:
        s.release(fence=1, expected_revision=2)
    assert (ei.value.presented, ei.value.current) == (1, 2)
    with pytest.raises(StaleFence):
        s.release(fence=3, expected_revision=2)  # a future fence is not accepted either


def test_outcome_fence_must_match_presented_fence() -> None:
    s = claimed()
    with pytest.raises(StaleFence) as ei:
        s.store_outcome(fence=1, expected_revision=1, outcome=ok(0))
    assert (ei.value.presented, ei.value.current) == (0, 1)


def test_lease_held_for_other_owner() -> None:
    s = claimed("OWNER-MARKER", now=0)
    before = copy.deepcopy(s)
    with pytest.raises(LeaseHeld) as ei:
        s.acquire(owner="B", now_ns=LEASE - 1, duration_ns=LEASE, expected_revision=1)
    assert ei.value.owner == "OWNER-MARKER" and ei.value.expires_ns == LEASE
    assert ei.value.identity == IDENT
    assert "OWNER-MARKER" not in str(ei.value)  # owner is an attribute, not in the message
    assert s == before


def test_lease_not_honoured_after_expiry() -> None:
    s = claimed("A", now=0)
    b = s.acquire(owner="B", now_ns=LEASE, duration_ns=LEASE, expected_revision=1)
    assert (b.owner, b.fence, b.ordinal, b.revision) == ("B", 2, 2, 2)


def test_acquire_without_owner() -> None:
    with pytest.raises(IllegalTransition) as ei:
        fresh().acquire(owner="", now_ns=0, duration_ns=LEASE, expected_revision=0)
    assert ei.value.state == "FREE"


@pytest.mark.parametrize("state_factory", [fresh, lambda: stored().release(fence=1, expected_revision=2)],
                         ids=["FREE", "RELEASED"])
def test_release_illegal_from_free_and_released(state_factory: object) -> None:
    s: ClaimState = state_factory()  # type: ignore[operator]
    with pytest.raises(IllegalTransition) as ei:
        s.release(fence=s.fence, expected_revision=s.revision)
    assert ei.value.state == s.status.value
    assert ei.value.action == "release"


@pytest.mark.parametrize("state_factory",
                         [fresh, stored, lambda: stored().release(fence=1, expected_revision=2)],
                         ids=["FREE", "OUTCOME_STORED", "RELEASED"])
def test_store_outcome_illegal_outside_claimed(state_factory: object) -> None:
    s: ClaimState = state_factory()  # type: ignore[operator]
    with pytest.raises(IllegalTransition):
        s.store_outcome(fence=s.fence, expected_revision=s.revision, outcome=ok(s.fence))


def test_second_outcome_rejected_after_reacquire() -> None:
    r = stored().release(fence=1, expected_revision=2)
    a = r.acquire(owner="B", now_ns=0, duration_ns=LEASE, expected_revision=3)
    with pytest.raises(IllegalTransition) as ei:
        a.store_outcome(fence=2, expected_revision=4, outcome=ok(2, kind=OutcomeKind.FAILED))
    assert "second outcome" in ei.value.action
    assert a.outcome == ok(1)
    # the new owner can still release, keeping the first outcome
    assert a.release(fence=2, expected_revision=4).outcome == ok(1)


def test_revision_overflow_refused() -> None:
    s = ClaimState(IDENT, revision=2**63 - 1)
    with pytest.raises(IllegalTransition):
        s.acquire(owner="A", now_ns=0, duration_ns=LEASE, expected_revision=2**63 - 1)


@pytest.mark.parametrize(("fence", "ordinal"), [(2**63 - 1, 0), (0, 2**63 - 1)])
def test_fence_or_ordinal_overflow_refused(fence: int, ordinal: int) -> None:
    s = ClaimState(IDENT, fence=fence, ordinal=ordinal, revision=3)
    with pytest.raises(IllegalTransition):
        s.acquire(owner="A", now_ns=0, duration_ns=LEASE, expected_revision=3)


def test_errors_are_claim_errors() -> None:
    for cls in (StaleFence, RevisionConflict, IllegalTransition, LeaseHeld):
        assert issubclass(cls, ClaimError)


# --- persistence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [
    fresh(),
    claimed(),
    stored(),
    stored().release(fence=1, expected_revision=2),
    ClaimState(IDENT2, ClaimStatus.CLAIMED, "w-1", 7, 2**62, 9, 30,
               Outcome(OutcomeKind.FAILED, 6, 123, 0, b"", "timeout")),
    ClaimState(IDENT2, ClaimStatus.RELEASED, "", 7, 0, 9, 31,
               Outcome(OutcomeKind.SKIPPED, 7, 0, 0, bytes(range(32)), None)),
], ids=["free", "claimed", "stored", "released", "claimed-with-failed", "released-skipped"])
def test_record_round_trip(state: ClaimState) -> None:
    rec = state.to_record()
    assert rec["status"] == state.status.value
    assert ClaimState.from_record(rec) == state
    assert ClaimState.from_record(copy.deepcopy(rec)).to_record() == rec
    if state.outcome is not None:
        assert isinstance(rec["outcome"]["digest"], bytes)
        assert rec["outcome"]["kind"] == state.outcome.kind.value


def test_from_record_accepts_missing_error_kind_and_bytearray_digest() -> None:
    rec = stored().to_record()
    del rec["outcome"]["error_kind"]
    rec["outcome"]["digest"] = bytearray(b"\x01\x02")
    s = ClaimState.from_record(rec)
    assert s.outcome is not None and s.outcome.error_kind is None and s.outcome.digest == b"\x01\x02"


def test_lease_held_in_outcome_stored() -> None:
    s = stored()  # owner A, lease until LEASE
    with pytest.raises(LeaseHeld):
        s.acquire(owner="B", now_ns=1, duration_ns=LEASE, expected_revision=s.revision)


def test_reopen_clears_a_failed_outcome_and_the_next_claim_has_a_greater_fence() -> None:
    s = claimed()
    failed = ok(s.fence, kind=OutcomeKind.FAILED)
    s = s.store_outcome(fence=s.fence, expected_revision=s.revision, outcome=failed)
    s = s.release(fence=s.fence, expected_revision=s.revision)
    r = s.reopen(expected_revision=s.revision, now_ns=LEASE + 1)
    assert (r.status, r.outcome, r.fence, r.ordinal, r.revision) == (ClaimStatus.RELEASED, None, s.fence, 0,
                                                                     s.revision + 1)
    again = r.acquire(owner="B", now_ns=LEASE + 2, duration_ns=LEASE, expected_revision=r.revision)
    assert again.fence == s.fence + 1 and again.ordinal == 1 and again.outcome is None


def test_reopen_refuses_success_without_force_a_live_lease_and_nothing_stored() -> None:
    done = stored().release(fence=1, expected_revision=2)
    with pytest.raises(IllegalTransition, match="without force"):
        done.reopen(expected_revision=done.revision, now_ns=LEASE + 1)
    assert done.reopen(expected_revision=done.revision, now_ns=LEASE + 1, force=True).outcome is None
    with pytest.raises(LeaseHeld):
        stored().reopen(expected_revision=2, now_ns=1, force=True)  # the execution finishes first
    with pytest.raises(IllegalTransition, match="no outcome"):
        fresh().reopen(expected_revision=0, now_ns=0)
    with pytest.raises(RevisionConflict):
        done.reopen(expected_revision=done.revision - 1, now_ns=LEASE + 1, force=True)


# --- stateful model ------------------------------------------------------------------------------

OWNERS = ("w1", "w2", "w3")
IDENTS = (IDENT, IDENT2)


class ClaimMachine(RuleBasedStateMachine):
    """Several owners race over two identities with a monotone clock and restarts.

    Each owner remembers the (fence, revision) it last observed per identity, as a real worker
    would; stale writes replay old pairs. The model is written independently of claims.py.
    """

    @initialize()
    def setup(self) -> None:
        self.now = 0
        self.states = {i: ClaimState(i) for i in IDENTS}
        self.acquires = dict.fromkeys(IDENTS, 0)
        """Acquires since the last reopen (the delivery ordinal)."""
        self.total_acquires = dict.fromkeys(IDENTS, 0)
        self.outcomes_stored = dict.fromkeys(IDENTS, 0)
        self.first_outcome: dict[str, Outcome | None] = dict.fromkeys(IDENTS)
        self.max_fence = dict.fromkeys(IDENTS, 0)
        self.history: dict[str, list[tuple[int, int]]] = {i: [(0, 0)] for i in IDENTS}  # (fence, rev)
        self.seen: dict[tuple[str, str], tuple[int, int]] = {}

    # helpers -------------------------------------------------------------------------------

    def _ok(self, ident: str, new: ClaimState) -> None:
        old = self.states[ident]
        assert new.identity == ident
        assert new.revision == old.revision + 1
        self.states[ident] = new
        self.history[ident].append((new.fence, new.revision))

    def _refused(self, ident: str, before: ClaimState, exc: type[ClaimError] | tuple[type[ClaimError], ...],
                 fn: object) -> ClaimError:
        with pytest.raises(exc) as ei:
            fn()  # type: ignore[operator]
        assert self.states[ident] == before
        assert self.states[ident].to_record() == before.to_record()
        return ei.value

    def _expected_acquire_error(self, s: ClaimState, owner: str) -> type[ClaimError] | None:
        # A lease is honoured until release, whether or not the outcome is stored yet.
        held = s.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED)
        if held and self.now < s.lease_expires_ns and s.owner != owner:
            return LeaseHeld
        return None

    # rules ---------------------------------------------------------------------------------

    @rule(ident=st.sampled_from(IDENTS), owner=st.sampled_from(OWNERS),
          advance=st.integers(min_value=0, max_value=2 * LEASE), duration=st.integers(1, 2 * LEASE))
    def acquire(self, ident: str, owner: str, advance: int, duration: int) -> None:
        self.now += advance
        s = self.states[ident]
        expected_err = self._expected_acquire_error(s, owner)
        if expected_err is not None:
            err = self._refused(ident, s, expected_err, lambda: s.acquire(
                owner=owner, now_ns=self.now, duration_ns=duration, expected_revision=s.revision))
            assert isinstance(err, LeaseHeld) and err.owner == s.owner
            return
        new = s.acquire(owner=owner, now_ns=self.now, duration_ns=duration, expected_revision=s.revision)
        assert new.fence > self.max_fence[ident]
        assert new.fence == s.fence + 1
        assert new.status is ClaimStatus.CLAIMED and new.owner == owner
        assert new.lease_expires_ns == self.now + duration
        assert new.outcome == s.outcome
        self.max_fence[ident] = new.fence
        self.acquires[ident] += 1
        self.total_acquires[ident] += 1
        self._ok(ident, new)
        self.seen[(owner, ident)] = (new.fence, new.revision)

    @rule(ident=st.sampled_from(IDENTS), owner=st.sampled_from(OWNERS),
          kind=st.sampled_from(list(OutcomeKind)), events=st.integers(0, 5))
    def store_outcome(self, ident: str, owner: str, kind: OutcomeKind, events: int) -> None:
        """The owner writes with the fence/revision it last saw (may be stale or current)."""
        if (owner, ident) not in self.seen:
            return
        fence, rev = self.seen[(owner, ident)]
        s = self.states[ident]
        outcome = Outcome(kind, fence, self.now, events, bytes([events]),
                          "boom" if kind is OutcomeKind.FAILED else None)
        call = lambda: s.store_outcome(fence=fence, expected_revision=rev, outcome=outcome)  # noqa: E731
        if rev != s.revision:
            err = self._refused(ident, s, RevisionConflict, call)
            assert isinstance(err, RevisionConflict)
            assert (err.presented, err.expected) == (rev, s.revision)
            return
        if s.status is not ClaimStatus.CLAIMED:
            self._refused(ident, s, IllegalTransition, call)
            return
        if fence != s.fence:
            self._refused(ident, s, StaleFence, call)
            return
        if s.outcome is not None:  # re-acquired after an outcome: never a second one
            self._refused(ident, s, IllegalTransition, call)
            return
        new = call()
        assert new.status is ClaimStatus.OUTCOME_STORED and new.outcome == outcome
        assert new.fence == s.fence and new.ordinal == s.ordinal
        self.outcomes_stored[ident] += 1
        self.first_outcome[ident] = outcome
        self._ok(ident, new)
        self.seen[(owner, ident)] = (new.fence, new.revision)

    @rule(ident=st.sampled_from(IDENTS), owner=st.sampled_from(OWNERS))
    def release(self, ident: str, owner: str) -> None:
        if (owner, ident) not in self.seen:
            return
        fence, rev = self.seen[(owner, ident)]
        s = self.states[ident]
        call = lambda: s.release(fence=fence, expected_revision=rev)  # noqa: E731
        if rev != s.revision:
            self._refused(ident, s, RevisionConflict, call)
            return
        if s.status not in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED):
            self._refused(ident, s, IllegalTransition, call)
            return
        if fence != s.fence:
            self._refused(ident, s, StaleFence, call)
            return
        new = call()
        assert new.status is ClaimStatus.RELEASED and new.owner == "" and new.lease_expires_ns == 0
        assert new.outcome == s.outcome and new.fence == s.fence and new.ordinal == s.ordinal
        self._ok(ident, new)
        self.seen[(owner, ident)] = (new.fence, new.revision)

    @rule(ident=st.sampled_from(IDENTS), kind=st.sampled_from(list(OutcomeKind)), then_release=st.booleans())
    def holder_progresses(self, ident: str, kind: OutcomeKind, then_release: bool) -> None:
        """The current holder (if any) stores its outcome and/or releases: the common path."""
        owner = self.states[ident].owner
        if not owner:
            return
        self.store_outcome(ident, owner, kind, 1)
        if then_release:
            self.release(ident, owner)

    @rule(ident=st.sampled_from(IDENTS), data=st.data())
    def stale_fence_write(self, ident: str, data: st.DataObject) -> None:
        """A zombie presents the current revision but an older fence: must be StaleFence."""
        s = self.states[ident]
        if s.status not in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED) or s.fence < 2:
            return
        old = data.draw(st.integers(0, s.fence - 1), label="old_fence")
        self._refused(ident, s, StaleFence,
                      lambda: s.release(fence=old, expected_revision=s.revision))
        if s.status is ClaimStatus.CLAIMED and s.outcome is None:
            self._refused(ident, s, StaleFence, lambda: s.store_outcome(
                fence=old, expected_revision=s.revision, outcome=Outcome(OutcomeKind.SUCCEEDED, old, 0)))

    @precondition(lambda self: any(len(h) > 1 for h in self.history.values()))
    @rule(ident=st.sampled_from(IDENTS), data=st.data(), owner=st.sampled_from(OWNERS))
    def stale_revision_write(self, ident: str, data: st.DataObject, owner: str) -> None:
        """Replaying any past (fence, revision) pair must be refused with RevisionConflict."""
        s = self.states[ident]
        past = self.history[ident][:-1]
        if not past:
            return
        fence, rev = data.draw(st.sampled_from(past), label="past")
        assert rev < s.revision
        self._refused(ident, s, RevisionConflict, lambda: s.release(fence=fence, expected_revision=rev))
        self._refused(ident, s, RevisionConflict, lambda: s.store_outcome(
            fence=fence, expected_revision=rev, outcome=Outcome(OutcomeKind.SUCCEEDED, fence, 0)))
        self._refused(ident, s, RevisionConflict, lambda: s.acquire(
            owner=owner, now_ns=self.now + 10 * LEASE, duration_ns=LEASE, expected_revision=rev))

    @rule(ident=st.sampled_from(IDENTS), force=st.booleans())
    def reopen(self, ident: str, force: bool) -> None:
        """An operator's re-drive: only a stored outcome, never under a live lease, SUCCEEDED only
        with force; the fence stays, so the next claim's is greater than every earlier one."""
        s = self.states[ident]
        call = lambda: s.reopen(expected_revision=s.revision, now_ns=self.now, force=force)  # noqa: E731
        held = s.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED) and self.now < s.lease_expires_ns
        if held:
            self._refused(ident, s, LeaseHeld, call)
            return
        if s.outcome is None or (s.outcome.kind is OutcomeKind.SUCCEEDED and not force):
            self._refused(ident, s, IllegalTransition, call)
            return
        new = call()
        assert new.status is ClaimStatus.RELEASED and new.outcome is None and new.owner == ""
        assert new.fence == s.fence and new.ordinal == 0 and new.lease_expires_ns == 0
        self.acquires[ident] = 0
        self.outcomes_stored[ident] = 0
        self.first_outcome[ident] = None
        self._ok(ident, new)

    @rule(ident=st.sampled_from(IDENTS))
    def illegal_release(self, ident: str) -> None:
        s = self.states[ident]
        if s.status in (ClaimStatus.FREE, ClaimStatus.RELEASED):
            self._refused(ident, s, IllegalTransition,
                          lambda: s.release(fence=s.fence, expected_revision=s.revision))

    @rule(advance=st.integers(0, 3 * LEASE))
    def tick(self, advance: int) -> None:
        self.now += advance

    @rule()
    def restart(self) -> None:
        """Crash and restore: every state goes through its persisted record; owners keep memory."""
        for ident, s in self.states.items():
            restored = ClaimState.from_record(copy.deepcopy(s.to_record()))
            assert restored == s
            self.states[ident] = restored

    # invariants ----------------------------------------------------------------------------

    @invariant()
    def counters_match_model(self) -> None:
        for ident, s in self.states.items():
            assert s.ordinal == self.acquires[ident]
            assert s.fence == self.max_fence[ident] == self.total_acquires[ident]
            assert s.revision == len(self.history[ident]) - 1

    @invariant()
    def history_strictly_increasing(self) -> None:
        for h in self.history.values():
            fences = [f for f, _ in h]
            revs = [r for _, r in h]
            assert revs == list(range(len(h)))
            assert fences == sorted(fences)

    @invariant()
    def outcome_at_most_once_and_immutable(self) -> None:
        for ident, s in self.states.items():
            assert self.outcomes_stored[ident] <= 1
            assert s.outcome == self.first_outcome[ident]
            if s.outcome is not None:
                assert s.outcome.fence <= s.fence
            if s.status is ClaimStatus.OUTCOME_STORED:
                assert s.outcome is not None

    @invariant()
    def status_shape(self) -> None:
        for s in self.states.values():
            if s.status is ClaimStatus.FREE:
                assert s.fence == 0 and s.ordinal == 0 and s.owner == ""
            if s.status is ClaimStatus.RELEASED:
                assert s.owner == "" and s.lease_expires_ns == 0 and not s.lease_active(self.now)
            if s.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED):
                assert s.owner in OWNERS and s.fence >= 1


ClaimMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestClaimMachine = ClaimMachine.TestCase


def test_defer_releases_without_charging_an_attempt_and_refuses_a_stale_fence() -> None:
    st = claimed()
    parked = st.park(fence=st.fence, expected_revision=st.revision, attempt=2, due_ns=50)
    again = parked.acquire(owner="A", now_ns=60, duration_ns=LEASE, expected_revision=parked.revision)
    deferred = again.defer(fence=again.fence, expected_revision=again.revision, due_ns=90)
    assert deferred.status is ClaimStatus.RELEASED and deferred.parked
    assert deferred.attempt == 2 and deferred.retry_due_ns == 90  # still attempt 3 next
    assert deferred.ordinal == again.ordinal and deferred.fence == again.fence
    with pytest.raises(StaleFence):
        again.defer(fence=again.fence - 1, expected_revision=again.revision, due_ns=90)
    with pytest.raises(IllegalTransition):
        deferred.defer(fence=deferred.fence, expected_revision=deferred.revision, due_ns=90)
    with pytest.raises(IllegalTransition):
        again.defer(fence=again.fence, expected_revision=again.revision, due_ns=0)


# --- cancel (an operator's cancel of waiting work) -----------------------------------------------


def parked() -> ClaimState:
    s = claimed()
    return s.park(fence=s.fence, expected_revision=s.revision, attempt=1, due_ns=LEASE * 5)


@pytest.mark.parametrize("waiting", [fresh, parked], ids=["never claimed", "parked retry"])
def test_cancel_stores_a_cancelled_failure_for_work_that_waits(waiting: object) -> None:
    s: ClaimState = waiting()  # type: ignore[operator]
    c = s.cancel(expected_revision=s.revision, now_ns=LEASE + 7)
    assert (c.status, c.owner, c.fence, c.ordinal, c.revision, c.attempt, c.run, c.retry_due_ns) == (
        ClaimStatus.RELEASED, "", s.fence, s.ordinal, s.revision + 1, s.attempt, s.run, 0)
    assert c.outcome == Outcome(OutcomeKind.FAILED, s.fence, LEASE + 7, error_kind=CANCELLED_KIND)
    assert c.outcome.cancelled and not c.parked
    assert ClaimState.from_record(c.to_record()) == c  # no schema change: a FAILED outcome
    # A later delivery keeps the outcome (it is released without running); a re-drive reopens it.
    again = c.acquire(owner="B", now_ns=LEASE + 8, duration_ns=LEASE, expected_revision=c.revision)
    assert again.outcome == c.outcome and again.fence == s.fence + 1
    reopened = c.reopen(expected_revision=c.revision, now_ns=LEASE + 8)
    assert reopened.outcome is None and reopened.run == s.run + 1


def test_cancel_refuses_a_claim_a_stored_outcome_a_stale_revision_and_a_stale_fence() -> None:
    with pytest.raises(LeaseHeld):
        claimed().cancel(expected_revision=1, now_ns=1)  # an attempt is running
    with pytest.raises(LeaseHeld):
        claimed().cancel(expected_revision=1, now_ns=LEASE + 1)  # its owner crashed: not taken over yet
    with pytest.raises(LeaseHeld):
        stored().cancel(expected_revision=2, now_ns=1)
    done = stored().release(fence=1, expected_revision=2)
    with pytest.raises(IllegalTransition, match="nothing waits"):
        done.cancel(expected_revision=done.revision, now_ns=LEASE + 1)
    c = parked().cancel(expected_revision=2, now_ns=LEASE + 1)
    with pytest.raises(IllegalTransition, match="nothing waits"):
        c.cancel(expected_revision=c.revision, now_ns=LEASE + 2)  # cancelled once
    with pytest.raises(RevisionConflict):
        parked().cancel(expected_revision=1, now_ns=LEASE + 1)
    with pytest.raises(StaleFence):
        parked().cancel(expected_revision=2, now_ns=LEASE + 1, fence=0)
    assert parked().cancel(expected_revision=2, now_ns=LEASE + 1, fence=1).outcome is not None


def test_only_an_operators_cancel_is_cancelled() -> None:
    assert not Outcome(OutcomeKind.FAILED, 1, 1, error_kind="cancelled").cancelled  # asyncio.CancelledError
    assert not Outcome(OutcomeKind.SKIPPED, 1, 1, error_kind=CANCELLED_KIND).cancelled
    assert not ok(1).cancelled


class CancelMachine(ClaimMachine):
    """The racing owners of :class:`ClaimMachine`, and an operator who cancels at any moment:
    every invariant still holds (one outcome per run, fences strictly increasing)."""

    @rule(ident=st.sampled_from(IDENTS))
    def cancel(self, ident: str) -> None:
        s = self.states[ident]
        call = lambda: s.cancel(expected_revision=s.revision, now_ns=self.now)  # noqa: E731
        held = s.status in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED)
        if held and self.now < s.lease_expires_ns:
            self._refused(ident, s, LeaseHeld, call)  # an attempt is running
            return
        if s.outcome is not None:
            self._refused(ident, s, IllegalTransition, call)  # nothing waits
            return
        if held:
            self._refused(ident, s, LeaseHeld, call)  # its owner crashed mid-attempt: not taken over yet
            return
        new = call()
        assert new.outcome is not None and new.outcome.cancelled and new.outcome.fence == s.fence
        assert new.status is ClaimStatus.RELEASED and new.fence == s.fence and new.ordinal == s.ordinal
        self.outcomes_stored[ident] += 1
        self.first_outcome[ident] = new.outcome
        self._ok(ident, new)


CancelMachine.TestCase.settings = ClaimMachine.TestCase.settings
TestCancelMachine = CancelMachine.TestCase
