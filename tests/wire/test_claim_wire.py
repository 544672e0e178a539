"""The hot-path claim encoder writes exactly what the validating codec writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.wire.claim import CLAIM_CODEC, encode_claim
from streamsched.worker.store import PartitionState

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
outcomes = st.none() | st.builds(
    Outcome, kind=st.sampled_from(OutcomeKind), fence=longs, at_ns=longs,
    events=st.integers(min_value=-(2**31), max_value=2**31 - 1), digest=st.binary(max_size=64),
    error_kind=st.none() | st.text(max_size=20))
states = st.builds(
    ClaimState, identity=st.text(min_size=1, max_size=80), status=st.sampled_from(ClaimStatus),
    owner=st.text(max_size=40), fence=longs, lease_expires_ns=longs, ordinal=longs, revision=longs,
    outcome=outcomes)


@given(states)
def test_fast_encoder_matches_validating_codec(state: ClaimState) -> None:
    assert encode_claim(state) == CLAIM_CODEC.encode(state.to_record())
    assert ClaimState.from_record(CLAIM_CODEC.decode(encode_claim(state))) == state


def test_restore_applies_latest_snapshot_and_tombstones() -> None:
    first = ClaimState("sched_" + "a" * 64).acquire(owner="w", now_ns=1, duration_ns=5, expected_revision=0)
    second = first.release(fence=1, expected_revision=1)
    ps = PartitionState(0)
    ps.apply_record(encode_claim(first), first.identity.encode())
    ps.apply_record(encode_claim(second), second.identity.encode())
    ps.apply_record(b"\x00garbage", b"k")
    assert ps.get(first.identity) == second and ps.corrupt == 1
    ps.apply_record(None, first.identity.encode())
    assert ps.get(first.identity).status is ClaimStatus.FREE
