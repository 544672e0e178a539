"""The pause record: what ``pause``/``resume`` write and every worker reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.model.jsonval import json_dumps
from streamsched.wire.pause import MAX_PAUSE_BYTES, PauseRecord


@given(paused=st.booleans(), principal=st.text(max_size=300), reason=st.text(max_size=300),
       at_ns=st.integers(0, 2**63 - 1))
def test_a_record_reads_back_as_written_with_safe_text(paused: bool, principal: str, reason: str,
                                                       at_ns: int) -> None:
    rec = PauseRecord.new(paused, principal=principal, at_ns=at_ns, reason=reason)
    back = PauseRecord.decode(rec.encode())
    assert back == rec and rec.key == rec.request.encode() and len(rec.request) == 32
    assert len(back.reason) <= 200 and len(back.principal) <= 200
    assert all(c.isprintable() for c in back.reason + back.principal)


@pytest.mark.parametrize("value", [
    None, b"", b"not json", b"[]", json_dumps({"v": 2, "paused": True, "principal": "p", "at_ns": 1}),
    json_dumps({"v": 1, "paused": "yes", "principal": "p", "at_ns": 1}),
    json_dumps({"v": 1, "paused": True, "principal": "p", "at_ns": -1}),
    json_dumps({"v": 1, "paused": True, "principal": "p", "at_ns": True}),
    json_dumps({"v": 1, "paused": True, "principal": 3, "at_ns": 1}),
    json_dumps({"v": 1, "paused": True, "principal": "p", "at_ns": 1, "reason": "x" * MAX_PAUSE_BYTES}),
])
def test_a_malformed_record_is_a_decode_error_without_its_bytes(value: bytes | None) -> None:
    with pytest.raises(DecodeError) as err:
        PauseRecord.decode(value)
    assert "xxxx" not in str(err.value) and "yes" not in str(err.value)
