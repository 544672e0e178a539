"""MirrorMaker 2's checkpoint records: the reader agrees with Kafka's layout byte for byte, round
trips, and refuses what is not a checkpoint with a DecodeError (never another exception)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.wire.mirror import Checkpoint, decode_checkpoint

names = st.text(min_size=0, max_size=40)
offsets = st.integers(min_value=0, max_value=2**63 - 1)


def test_layout_matches_kafkas_struct_encoding() -> None:
    # Written out by hand from org.apache.kafka.connect.mirror.Checkpoint's schemas:
    # key: group STRING, topic STRING, partition INT32; value: version INT16, upstreamOffset
    # INT64, offset INT64, metadata STRING (a STRING is an INT16 length, then UTF-8).
    key = b"\x00\x01g" + b"\x00\x02t1" + b"\x00\x00\x00\x03"
    value = b"\x00\x00" + struct.pack(">q", 120) + struct.pack(">q", 100) + b"\x00\x00"
    cp = decode_checkpoint(key, value)
    assert cp == Checkpoint("g", "t1", 3, 120, 100, "")
    assert cp.encode_key() == key and cp.encode_value() == value


@given(names, names, st.integers(min_value=0, max_value=2**31 - 1), offsets, offsets, names)
def test_round_trip(group: str, topic: str, partition: int, up: int, down: int, meta: str) -> None:
    cp = Checkpoint(group, topic, partition, up, down, meta)
    assert decode_checkpoint(cp.encode_key(), cp.encode_value()) == cp


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_garbage_is_a_decode_error(key: bytes, value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_checkpoint(key, value)


@pytest.mark.parametrize("cut", [1, 5, 17, 19])
def test_truncated_value_is_refused(cut: int) -> None:
    cp = Checkpoint("group", "topic", 0, 10, 9, "m")
    with pytest.raises(DecodeError):
        decode_checkpoint(cp.encode_key(), cp.encode_value()[:cut])


def test_unknown_version_and_missing_parts_are_refused() -> None:
    cp = Checkpoint("group", "topic", 0, 10, 9)
    with pytest.raises(DecodeError, match="version 1"):
        decode_checkpoint(cp.encode_key(), b"\x00\x01" + cp.encode_value()[2:])
    with pytest.raises(DecodeError):
        decode_checkpoint(None, cp.encode_value())
    with pytest.raises(DecodeError, match="trailing"):
        decode_checkpoint(cp.encode_key() + b"x", cp.encode_value())
