"""The one-pass canonical reader accepts exactly what the three-pass path accepted.

Before issue 10, :meth:`AvroCodec.decode` read with fastavro, re-encoded through the validating
writer and compared the bytes. The one-pass reader replaces that (it was the worker's largest
decode cost); these tests pin that it accepts the same byte strings, returns the same records,
and refuses each single defect with the same reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from avro_strategies import avro_values, zigzag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsched.wire.avro import MAGIC, SCHEMA_IDS, AvroCodec, get_codec

NAMES = sorted(SCHEMA_IDS, key=SCHEMA_IDS.__getitem__)
DIFF = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])



def both(codec: AvroCodec, data: bytes) -> tuple[Any, Any]:
    """(one-pass result, three-pass result): a record dict or a refusal reason each."""
    assert codec._reader is not None, "every shipped schema compiles to a one-pass reader"
    return codec._read(data), codec._decode_three_pass(data)


@st.composite
def defective(draw: st.DrawFn, name: str) -> bytes:
    """A valid encoding with a few byte-level mutations (often several defects at once)."""
    data = bytearray(get_codec(name).encode(draw(avro_values(name))))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(2, max(len(data) - 1, 2)))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
        if op == "flip" and pos < len(data):
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "set" and pos < len(data):
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            data[pos:pos] = draw(st.sampled_from([b"\x00", b"\x80", b"\x80\x00", b"\x01", b"\xff\x01"]))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 4))]
        elif op == "splice":
            data[pos:pos] = zigzag(draw(st.sampled_from([-1, -2, 2**31, -(2**31) - 1, 2**62, -(2**63)])))
        else:
            del data[pos:]
    return bytes(data)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@DIFF
def test_valid_encodings_decode_to_the_same_record(name: str, data: st.DataObject) -> None:
    codec = get_codec(name)
    encoded = codec.encode(data.draw(avro_values(name)))
    one, three = both(codec, encoded)
    assert isinstance(one, dict) and one == three
    assert codec.encode(one) == encoded


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@DIFF
def test_mutated_encodings_are_accepted_or_refused_alike(name: str, data: st.DataObject) -> None:
    codec = get_codec(name)
    one, three = both(codec, data.draw(defective(name)))
    # Acceptance is identical; with several defects at once the reported reason may name a
    # different one of them (the first met in reading order instead of the three-pass priority).
    assert isinstance(one, dict) == isinstance(three, dict)
    if isinstance(one, dict):
        assert one == three


def test_single_defects_are_refused_with_the_three_pass_reasons() -> None:
    claim = get_codec("claim")
    good = claim.encode({"identity": "id", "status": "CLAIMED", "owner": "o", "fence": 3,
                         "lease_expires_ns": 10, "ordinal": 1, "revision": 1, "outcome": None})
    tail = good[-3:]  # attempt, run, retry_due_ns: after the outcome's union index
    good = good[:-3]  # ... which the union cases below change as the last byte
    body = good[2:]
    # identity "id" = 04 69 64, status CLAIMED = 02, owner "o" = 02 6f, fence 3 = 06 ...
    assert body.startswith(b"\x04id\x02\x02o\x06")
    cases = {
        "overlong varint": good[:2] + b"\x84\x00id" + body[3:] + tail,
        "negative enum index": good[:2] + b"\x04id\x01" + body[4:] + tail,
        "enum index past the symbols": good[:2] + b"\x04id\x10" + body[4:] + tail,
        "negative union index": good[:-1] + b"\x01" + tail,
        "union index past the branches": good[:-1] + b"\x06" + tail,
        "truncated string": good[:4],
        "invalid utf-8": good[:2] + b"\x04\xff\xfe" + body[3:] + tail,
        "trailing bytes": good + tail + b"\x00",
    }
    for what, data in cases.items():
        one, three = both(claim, data)
        assert isinstance(one, str) and one == three, (what, one, three)
    # A negative length: fastavro read "the rest" and tripped further on; one pass names it.
    one, three = both(claim, good[:2] + b"\x03id" + body[3:] + tail)
    assert one == "invalid avro" and isinstance(three, str)
    # A varint of more than 64 bits: fastavro wrapped it around (so the re-encode differed).
    one, three = both(claim, good[:2] + b"\x04id\x02\x02o" + b"\xff" * 9 + b"\x7f" + body[7:] + tail)
    assert (one, three) == ("invalid avro", "non-canonical encoding")


def test_arrays_in_several_or_sized_blocks_are_non_canonical() -> None:
    tr = get_codec("transition")
    rec = {"event_id": "e", "type": "t", "tenant": "x", "target": ["a", "b"], "due_ns": 1,
           "payload": b"{}", "produced_ns": 2, "attempt": 1, "origin": None}
    good = tr.encode(rec)
    one_block = b"\x04\x02a\x02b\x00"
    at = good.index(one_block)
    two_blocks = good[:at] + b"\x02\x02a\x02\x02b\x00" + good[at + len(one_block):]
    sized = good[:at] + b"\x03\x08\x02a\x02b\x00" + good[at + len(one_block):]
    for data in (two_blocks, sized):
        one, three = both(tr, data)
        assert one == three == "non-canonical encoding"
    assert both(tr, good)[0] == rec


def test_every_envelope_check_still_comes_first() -> None:
    claim = get_codec("claim")
    assert claim._read(b"\xa5\x02") == "truncated"
    assert claim.decode(bytes((MAGIC, SCHEMA_IDS["claim"])) + b"\x04id\x02\x02o\x02\x00\x02\x02\x00"
                        + b"\x00\x02\x00") == {
        "identity": "id", "status": "CLAIMED", "owner": "o", "fence": 1, "lease_expires_ns": 0,
        "ordinal": 1, "revision": 1, "outcome": None, "attempt": 0, "run": 1, "retry_due_ns": 0}
