"""streamsched.wire.partitioner is Kafka's murmur2, bit for bit.

Checked against aiokafka's implementation (which the Java client's vectors in
tests/wire/test_wire_vectors.py pin) for arbitrary keys, and against the contract's vectors.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.kafka.writer import partition_for_key as writer_partition_for_key
from streamsched.wire.partitioner import murmur2, partition_for_key

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "docs" / "wire-vectors.json").read_text())


@given(data=st.binary(max_size=300), partitions=st.integers(1, 2**31 - 1))
@settings(max_examples=3000, deadline=None)
def test_same_as_aiokafka(data: bytes, partitions: int) -> None:
    assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF
    assert partition_for_key(data, partitions) == writer_partition_for_key(data, partitions)


def test_every_length_and_tail() -> None:
    for n in range(0, 80):
        for fill in (0x00, 0x7F, 0x80, 0xFF):
            data = bytes((fill + i * 37) & 0xFF for i in range(n))
            assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF, n


def test_contract_vectors() -> None:
    for case in VECTORS["murmur2"]:
        key = bytes.fromhex(case["key_hex"])
        assert murmur2(key) == case["murmur2_signed"] & 0xFFFFFFFF
        assert partition_for_key(key, 2**31) == case["murmur2_positive"]
    for vector in VECTORS["valid"]:
        key = bytes.fromhex(vector["route_key_hex"])
        for n, partition in vector["partitions"].items():
            assert partition_for_key(key, int(n)) == partition
