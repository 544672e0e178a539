"""The retry budget in the claim state machine: ``park``, the attempt count, runs and ``reopen``.

The count belongs to the identity: ``attempt`` survives every claim and release of a run,
``park`` records a retry and when it is due, a claim takes a parked retry over, and ``reopen``
(an operator's re-drive) starts the next run at attempt 0.
"""

from __future__ import annotations

import copy

import pytest

from streamsched.errors import IllegalTransition, RevisionConflict, StaleFence
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.model.identity import IdentityParts, business_identity

IDENT = business_identity(IdentityParts("sched", "topic", "sel", 1, "tenant", ("k",), "run"))
LEASE = 1_000
DUE = 50_000


def claimed(st: ClaimState | None = None, now: int = 0) -> ClaimState:
    st = st or ClaimState(IDENT)
    return st.acquire(owner="w", now_ns=now, duration_ns=LEASE, expected_revision=st.revision)


def parked(attempt: int = 1) -> ClaimState:
    c = claimed()
    return c.park(fence=c.fence, expected_revision=c.revision, attempt=attempt, due_ns=DUE)


def failed(st: ClaimState, attempt: int) -> ClaimState:
    out = Outcome(OutcomeKind.FAILED, st.fence, 7, error_kind="handler_retryable")
    stored = st.store_outcome(fence=st.fence, expected_revision=st.revision, outcome=out, attempt=attempt)
    return stored.release(fence=stored.fence, expected_revision=stored.revision)


def test_a_fresh_identity_is_at_attempt_zero_of_run_one_and_not_parked() -> None:
    st = ClaimState(IDENT)
    assert (st.attempt, st.run, st.retry_due_ns, st.parked) == (0, 1, 0, False)


def test_park_releases_without_an_outcome_and_records_the_attempt_and_its_retry() -> None:
    p = parked(attempt=2)
    assert (p.status, p.owner, p.lease_expires_ns, p.outcome) == (ClaimStatus.RELEASED, "", 0, None)
    assert (p.attempt, p.run, p.retry_due_ns, p.parked) == (2, 1, DUE, True)
    assert (p.fence, p.ordinal, p.revision) == (1, 1, 2)


def test_a_claim_takes_the_parked_retry_over_and_keeps_the_count() -> None:
    again = claimed(parked(attempt=2), now=DUE)
    assert (again.status, again.attempt, again.run, again.retry_due_ns, again.parked) == (
        ClaimStatus.CLAIMED, 2, 1, 0, False)
    assert again.fence == 2 and again.ordinal == 2
    # The next attempt fails retryably again, or ends the run with an outcome.
    p = again.park(fence=2, expected_revision=again.revision, attempt=3, due_ns=DUE * 2)
    assert (p.attempt, p.retry_due_ns) == (3, DUE * 2)
    done = failed(claimed(p, now=DUE * 2), attempt=4)
    assert (done.attempt, done.run, done.retry_due_ns, done.parked) == (4, 1, 0, False)
    assert done.outcome is not None and done.outcome.kind is OutcomeKind.FAILED


def test_a_release_keeps_the_count_and_an_outcome_without_an_attempt_keeps_it_too() -> None:
    c = claimed(parked(attempt=2), now=DUE)
    released = c.release(fence=c.fence, expected_revision=c.revision)  # e.g. nothing ran
    assert (released.attempt, released.retry_due_ns, released.parked) == (2, 0, False)
    c = claimed(released, now=DUE)
    out = Outcome(OutcomeKind.FAILED, c.fence, 9, error_kind="attempts_exhausted")
    stored = c.store_outcome(fence=c.fence, expected_revision=c.revision, outcome=out)
    assert stored.attempt == 2


def test_reopen_starts_the_next_run_at_attempt_zero() -> None:
    done = failed(claimed(parked(attempt=2), now=DUE), attempt=3)
    r = done.reopen(expected_revision=done.revision, now_ns=DUE + LEASE)
    assert (r.status, r.outcome, r.attempt, r.run, r.retry_due_ns, r.ordinal) == (
        ClaimStatus.RELEASED, None, 0, 2, 0, 0)
    again = failed(claimed(r, now=DUE + LEASE), attempt=1)
    r3 = again.reopen(expected_revision=again.revision, now_ns=DUE + 3 * LEASE)
    assert (r3.run, r3.attempt) == (3, 0)


def test_park_is_refused_outside_a_claim_without_an_outcome() -> None:
    p = parked()
    with pytest.raises(IllegalTransition, match="park a retry"):
        p.park(fence=p.fence, expected_revision=p.revision, attempt=2, due_ns=DUE)  # released
    with pytest.raises(IllegalTransition, match="park a retry"):
        ClaimState(IDENT).park(fence=0, expected_revision=0, attempt=1, due_ns=DUE)
    c = claimed()
    out = Outcome(OutcomeKind.SUCCEEDED, c.fence, 1)
    stored = c.store_outcome(fence=c.fence, expected_revision=c.revision, outcome=out, attempt=1)
    with pytest.raises(IllegalTransition, match="park a retry"):
        stored.park(fence=stored.fence, expected_revision=stored.revision, attempt=1, due_ns=DUE)
    again = claimed(failed(claimed(), attempt=1), now=LEASE)  # re-claimed after a stored outcome
    with pytest.raises(IllegalTransition, match="park a retry"):
        again.park(fence=again.fence, expected_revision=again.revision, attempt=2, due_ns=DUE)


def test_park_checks_revision_fence_attempt_and_due_time() -> None:
    c = claimed(parked(attempt=2), now=DUE)
    with pytest.raises(RevisionConflict):
        c.park(fence=c.fence, expected_revision=c.revision - 1, attempt=3, due_ns=DUE)
    with pytest.raises(StaleFence):
        c.park(fence=c.fence - 1, expected_revision=c.revision, attempt=3, due_ns=DUE)
    with pytest.raises(IllegalTransition, match="earlier attempt"):
        c.park(fence=c.fence, expected_revision=c.revision, attempt=1, due_ns=DUE)
    with pytest.raises(IllegalTransition, match="earlier attempt"):
        claimed().park(fence=1, expected_revision=1, attempt=0, due_ns=DUE)
    with pytest.raises(IllegalTransition, match="due time"):
        c.park(fence=c.fence, expected_revision=c.revision, attempt=3, due_ns=0)
    out = Outcome(OutcomeKind.SUCCEEDED, c.fence, 1)
    with pytest.raises(IllegalTransition, match="earlier attempt"):
        c.store_outcome(fence=c.fence, expected_revision=c.revision, outcome=out, attempt=1)
    # A crashed attempt runs again under a new claim: the same number is recorded again.
    assert c.park(fence=c.fence, expected_revision=c.revision, attempt=2, due_ns=DUE).attempt == 2


@pytest.mark.parametrize("state", [
    parked(attempt=2),
    claimed(parked(attempt=2), now=DUE),
    failed(claimed(parked(attempt=2), now=DUE), attempt=3),
    ClaimState(IDENT, ClaimStatus.RELEASED, "", 9, 0, 0, 40, None, 0, 2**40, 0),
], ids=["parked", "claimed-retry", "failed", "many-runs"])
def test_the_count_run_and_parked_retry_survive_the_record(state: ClaimState) -> None:
    rec = state.to_record()
    assert (rec["attempt"], rec["run"], rec["retry_due_ns"]) == (state.attempt, state.run, state.retry_due_ns)
    assert ClaimState.from_record(copy.deepcopy(rec)) == state


def test_a_record_without_the_run_fields_reads_as_the_first_run_not_parked() -> None:
    rec = claimed().to_record()
    for name in ("attempt", "run", "retry_due_ns"):
        del rec[name]
    st = ClaimState.from_record(rec)
    assert (st.attempt, st.run, st.retry_due_ns, st.parked) == (0, 1, 0, False)
