"""The executions audit of the reference workflows (consumers.harness.judge_calls), on made-up
claim histories: it must flag exactly the calls a stored outcome should have prevented."""

from __future__ import annotations

from consumers.harness import judge_calls
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind


def claimed(fence: int, outcome: Outcome | None = None) -> ClaimState:
    return ClaimState("k", ClaimStatus.CLAIMED, "w", fence, 1, fence, 2 * fence - 1, outcome)


def released(fence: int, outcome: Outcome | None) -> ClaimState:
    return ClaimState("k", ClaimStatus.RELEASED, "", fence, 0, fence, 2 * fence, outcome)


def ok(fence: int) -> Outcome:
    return Outcome(OutcomeKind.SUCCEEDED, fence, 0)


def test_one_call_under_the_outcomes_fence_is_clean() -> None:
    judged = judge_calls([("k", 1)], {"k": [claimed(1), released(1, ok(1))]})
    assert judged.after_outcome == {} and judged.unbacked == [] and judged.retried == []
    assert judged.outcome_fence == {"k": 1}


def test_a_repeat_before_the_outcome_was_stored_is_an_allowed_retry() -> None:
    # A crash between effect and outcome under fence 1; fence 2 runs again and stores it.
    history = {"k": [claimed(1), claimed(2), released(2, ok(2))]}
    judged = judge_calls([("k", 1), ("k", 2)], history)
    assert judged.after_outcome == {} and judged.unbacked == [] and judged.retried == ["k"]


def test_a_call_under_a_claim_taken_after_the_outcome_is_a_second_execution() -> None:
    history = {"k": [claimed(1), released(1, ok(1)), claimed(2), released(2, ok(2))]}
    judged = judge_calls([("k", 1), ("k", 2)], history)
    assert judged.after_outcome == {"k": [2]} and judged.retried == []


def test_a_call_under_a_claim_that_lost_the_outcome_is_still_seen() -> None:
    # A restored state that forgot the outcome: the new claim carries none, the log still does.
    history = {"k": [claimed(1), released(1, ok(1)), claimed(2, None)]}
    assert judge_calls([("k", 1), ("k", 2)], history).after_outcome == {"k": [2]}


def test_a_success_no_call_produced_is_unbacked() -> None:
    judged = judge_calls([], {"k": [claimed(1), released(1, ok(1))]})
    assert judged.unbacked == ["k"]


def test_a_redrive_reopens_the_identity() -> None:
    reopened = ClaimState("k", ClaimStatus.RELEASED, "", 1, 0, 0, 3, None)
    history = {"k": [claimed(1), released(1, ok(1)), reopened, claimed(2), released(2, ok(2))]}
    judged = judge_calls([("k", 1), ("k", 2)], history)
    assert judged.after_outcome == {} and judged.unbacked == []


def test_a_call_after_the_outcomes_record_is_a_second_execution_whatever_its_fence() -> None:
    # A restart that lost its claims starts fences again: fence 1 twice, the second call
    # accepted 5 ms after the outcome's record was produced (at 1000 ms).
    history = {"k": [claimed(1), released(1, ok(1))]}
    stamps = {"k": [999, 1000]}
    first, again = ("k", 1, 999_500_000), ("k", 1, 1_005_000_000)
    assert judge_calls([first], history, stamps).after_outcome == {}
    assert judge_calls([first, again], history, stamps).after_outcome == {"k": [1]}
    # Within the millisecond of the record (its timestamp is truncated) is still the first call.
    assert judge_calls([("k", 1, 1_000_900_000)], history, stamps).after_outcome == {}


def test_a_snapshot_that_lost_the_outcome_and_its_fence_reopens_nothing() -> None:
    lost = ClaimState("k", ClaimStatus.RELEASED, "", 0, 0, 0, 3, None)
    history = {"k": [claimed(1), released(1, ok(1)), lost, claimed(1), released(1, ok(1))]}
    stamps = {"k": [999, 1000, 2000, 2001, 2002]}
    judged = judge_calls([("k", 1, 999_500_000), ("k", 1, 2_001_500_000)], history, stamps)
    assert judged.after_outcome == {"k": [1]}
