"""The in-memory claim state (streamsched/worker/store.py ``PartitionState``): snapshots kept as
their state-topic bytes, out of the cycle collector's sight, with a bounded decoded cache.
The horizon and fence-floor rules both stores share are in tests/worker/test_claimstore.py."""

from __future__ import annotations

import gc

import pytest

from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.wire.claim import encode_claim
from streamsched.worker.store import DECODED_MAX, PartitionState

NOW = 1_750_000_000_000_000_000


def resolved(identity: str, fence: int) -> ClaimState:
    return ClaimState(identity, ClaimStatus.RELEASED, "", fence, 0, 1, 3,
                      Outcome(OutcomeKind.SUCCEEDED, fence, NOW, 1, b"\x01" * 32))


def test_snapshots_come_back_equal_after_the_decoded_cache_let_them_go() -> None:
    state = PartitionState(0)
    states = [resolved(f"sched_{i:05d}", i + 1) for i in range(DECODED_MAX + 100)]
    for i, st in enumerate(states):
        state.put(st, encode_claim(st) if i % 2 else None)  # with and without the caller's bytes
    assert state.identities() == len(states)
    assert len(state._decoded) <= DECODED_MAX
    assert all(state.get(st.identity) == st for st in states)
    assert state.get("sched_unknown") == ClaimState("sched_unknown")


def test_the_cycle_collector_does_not_track_the_stored_snapshots() -> None:
    state = PartitionState(0)
    for i in range(1000):
        st = resolved(f"sched_{i:05d}", 1)
        state.apply_record(encode_claim(st), st.identity.encode())
    gc.collect()
    assert not any(gc.is_tracked(entry) for entry in state._encoded.values())
    # ClaimState objects would be: the reason the bytes are kept instead.
    assert gc.is_tracked(resolved("sched_x", 1))


def test_a_tombstone_removes_both_forms_and_a_later_put_wins() -> None:
    state = PartitionState(0)
    first = resolved("sched_a", 1)
    state.apply_record(encode_claim(first), b"sched_a")
    assert state.get("sched_a") == first
    state.apply_record(None, b"sched_a")
    assert state.get("sched_a") == ClaimState("sched_a") and state.identities() == 0
    claimed = first.acquire(owner="w", now_ns=NOW, duration_ns=10**9, expected_revision=3)
    state.put(claimed)
    state._decoded.clear()
    assert state.get("sched_a") == claimed


def test_the_claim_state_base_is_abstract_over_its_storage_primitives() -> None:
    from streamsched.worker.statebase import StateBase

    primitives = {"_lookup", "put", "_drop", "_scan_page", "identities", "_committed", "close"}
    assert StateBase.__abstractmethods__ == primitives
    with pytest.raises(TypeError, match="abstract"):
        StateBase(0)  # type: ignore[abstract]
    assert not PartitionState.__abstractmethods__
    assert PartitionState(0).get("sched_a") == ClaimState("sched_a")
