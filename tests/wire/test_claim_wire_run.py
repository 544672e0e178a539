"""The claim snapshot's run fields on the wire: ``attempt``, ``run``, ``retry_due_ns``.

They were appended after 0.1.0: the hot-path encoder writes them exactly as the validating codec
does, and a snapshot written before they existed (a state topic of 0.1.0, a claim store on disk)
still reads, at their defaults, so an upgraded worker restores every outcome it had.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.wire.avro import schema_dir
from streamsched.wire.claim import CLAIM_CODEC, CLAIM_PREFIX, decode_claim, encode_claim, resolved_at

RUN_FIELDS = ("attempt", "run", "retry_due_ns")
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
states = st.builds(
    ClaimState, identity=st.text(min_size=1, max_size=40), status=st.sampled_from(ClaimStatus),
    owner=st.text(max_size=20), fence=longs, lease_expires_ns=longs, ordinal=longs, revision=longs,
    outcome=st.none() | st.builds(Outcome, kind=st.sampled_from(OutcomeKind), fence=longs, at_ns=longs),
    attempt=longs, run=longs, retry_due_ns=longs)


def written_by_0_1_0(record: dict[str, Any]) -> bytes:
    """``record`` as 0.1.0 wrote it: the claim schema without the run fields."""
    schema = json.loads((schema_dir() / "claim.avsc").read_text())
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in RUN_FIELDS]
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return CLAIM_PREFIX + buf.getvalue()


@given(states)
def test_fast_encoder_writes_the_run_fields_as_the_codec_does(state: ClaimState) -> None:
    assert encode_claim(state) == CLAIM_CODEC.encode(state.to_record())
    assert decode_claim(encode_claim(state)) == state


def test_the_run_fields_come_last_with_defaults() -> None:
    schema = json.loads((schema_dir() / "claim.avsc").read_text())
    tail = schema["fields"][-3:]
    assert [(f["name"], f["type"], f["default"]) for f in tail] == [
        ("attempt", "long", 0), ("run", "long", 1), ("retry_due_ns", "long", 0)]


@pytest.mark.parametrize("outcome", [None, Outcome(OutcomeKind.FAILED, 4, 123, 0, b"\x01", "terminal")])
def test_a_snapshot_of_0_1_0_reads_as_attempt_zero_of_run_one_not_parked(outcome: Outcome | None) -> None:
    before = ClaimState("sched_" + "a" * 64, ClaimStatus.RELEASED, "", 4, 0, 3, 9, outcome)
    old = {k: v for k, v in before.to_record().items() if k not in RUN_FIELDS}
    raw = written_by_0_1_0(old)
    with pytest.raises(DecodeError, match="truncated"):
        CLAIM_CODEC.decode(raw)  # the codec reads the current layout only
    st_ = decode_claim(raw)
    assert st_ == before and (st_.attempt, st_.run, st_.retry_due_ns) == (0, 1, 0)
    assert resolved_at(raw) == (123 if outcome is not None else None)
    assert resolved_at(encode_claim(before)) == resolved_at(raw)  # the horizon scan reads both


def test_a_snapshot_cut_inside_its_fields_is_still_refused() -> None:
    raw = encode_claim(ClaimState("sched_x", ClaimStatus.RELEASED, "", 4, 0, 3, 9, None, 300, 2, 10**18))
    for cut in (1, 2, len(raw) - 2 - 30):
        with pytest.raises(DecodeError):
            decode_claim(raw[:-cut])
