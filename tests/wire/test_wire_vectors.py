"""The wire contract's test vectors (docs/wire-vectors.json) are what the code computes.

Each vector is checked three ways: against streamsched's own functions, against an independent
reading of the written specification (route-key pre-image, a Java-faithful murmur2, the
reference ``avro`` package for the body), and, on a real broker, against librdkafka's
``murmur2_random`` partitioner, which other-language producers are told to use.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import io
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import avro.io
import avro.schema
import pytest

from streamsched.errors import BoundExceeded, DecodeError, InvalidName
from streamsched.kafka.producer import encode_event
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.wire.avro import MAGIC, SCHEMA_IDS, get_codec, schema_dir
from streamsched.wire.transition import decode_transition, encode_transition

ROOT = Path(__file__).resolve().parent.parent.parent
VECTORS = json.loads((ROOT / "docs" / "wire-vectors.json").read_text(encoding="utf-8"))
CONTRACT = (ROOT / "docs" / "wire-contract.md").read_text(encoding="utf-8")
ERRORS: dict[str, type[Exception]] = {"DecodeError": DecodeError, "BoundExceeded": BoundExceeded,
                                      "InvalidName": InvalidName}


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_wire_vectors.py"
    spec = importlib.util.spec_from_file_location("gen_wire_vectors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def java_murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2``, transcribed (unsigned 32-bit result)."""
    mask, m, r = 0xFFFFFFFF, 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def event_of(fields: dict[str, Any]) -> TransitionEvent:
    return TransitionEvent(
        event_id=fields["event_id"], type=fields["type"], tenant=fields["tenant"],
        target=tuple(fields["target"]), due_ns=fields["due_ns"], payload=fields["payload"].encode(),
        produced_ns=fields["produced_ns"], attempt=fields["attempt"], origin=fields["origin"])


VALID = VECTORS["valid"]
INVALID = VECTORS["invalid"]


def test_vectors_file_is_generated_from_the_code() -> None:
    text = (ROOT / "docs" / "wire-vectors.json").read_text(encoding="utf-8")
    assert _generator().render() == text, "run scripts/gen_wire_vectors.py"
    assert VECTORS["magic"] == MAGIC and VECTORS["schema_id"] == SCHEMA_IDS["transition"]
    assert VECTORS["partition_counts"] == [1, 3, 8, 12, 64]
    assert len(VALID) >= 10 and len(INVALID) >= 10


def test_kafka_murmur2_vectors() -> None:
    from aiokafka.partitioner import murmur2

    for case in VECTORS["murmur2"]:
        key = bytes.fromhex(case["key_hex"])
        assert java_murmur2(key) == case["murmur2_signed"] & 0xFFFFFFFF
        assert murmur2(key) & 0xFFFFFFFF == case["murmur2_signed"] & 0xFFFFFFFF
        assert partition_for_key(key, 2**31) == case["murmur2_positive"]


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_vector(vector: dict[str, Any]) -> None:
    fields = vector["event"]
    ev = event_of(fields)
    key = route_key(ev.tenant, ev.target)
    # Route key: the code, and the pre-image the document specifies, agree.
    assert key.decode("ascii") == vector["route_key"] and key.hex() == vector["route_key_hex"]
    preimage = bytes.fromhex(vector["route_key_preimage_hex"])
    assert preimage.startswith(b"streamsched/route-key/v1\x00")
    assert hashlib.sha256(preimage).hexdigest()[:32] == vector["route_key"]
    assert re.fullmatch(r"[0-9a-f]{32}", vector["route_key"])
    # Partitioner: ours, and a transcription of the Java client's.
    assert java_murmur2(key) & 0x7FFFFFFF == vector["murmur2_positive"]
    for n, partition in vector["partitions"].items():
        assert partition_for_key(key, int(n)) == partition == vector["murmur2_positive"] % int(n)
    # Envelope: magic, schema id, Avro body; it decodes back to the same event.
    envelope = bytes.fromhex(vector["envelope_hex"])
    assert envelope[:2] == bytes((0xA5, 0x01))
    assert encode_transition(ev) == envelope and encode_event(ev) == (key, envelope)
    assert decode_transition(envelope) == ev


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_envelope_body_is_plain_avro(vector: dict[str, Any]) -> None:
    """The reference Avro implementation reads the body and writes the identical bytes."""
    schema = avro.schema.parse((schema_dir() / "transition.avsc").read_text())
    body = bytes.fromhex(vector["envelope_hex"])[2:]
    record = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(body)))
    fields = vector["event"]
    assert record == {**fields, "payload": fields["payload"].encode()}
    out = io.BytesIO()
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(out))
    assert out.getvalue() == body


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_vector_is_refused(vector: dict[str, Any]) -> None:
    ev = event_of(vector["event"])
    with pytest.raises(ERRORS[vector["error"]]) as info:
        encode_event(ev)
    exc = info.value
    if isinstance(exc, BoundExceeded):
        assert exc.bound == vector["detail"]
        return
    assert isinstance(exc, DecodeError | InvalidName) and exc.reason == vector["detail"]
    if isinstance(exc, DecodeError):
        # What the producer refuses, the worker's decoder refuses too (it would dead-letter it).
        try:
            raw = get_codec("transition").encode(ev.to_record())
        except DecodeError:
            return  # the schema layer itself refuses it (an array bound)
        with pytest.raises(DecodeError) as decoded:
            decode_transition(raw)
        assert "encode: " + decoded.value.reason == vector["detail"]


def test_contract_lists_every_schema_id() -> None:
    for name, schema_id in SCHEMA_IDS.items():
        assert f"| {schema_id} | `{name}` |" in CONTRACT


def test_contract_states_every_bound() -> None:
    from streamsched.model import limits
    from streamsched.model.event import MAX_EVENT_TYPE_LENGTH

    for value in (limits.MAX_EVENT_ID_LENGTH, MAX_EVENT_TYPE_LENGTH, limits.MAX_COMPONENT_BYTES,
                  limits.MAX_TARGET_COMPONENTS, limits.MAX_TARGET_BYTES, limits.MAX_PAYLOAD_BYTES,
                  limits.MAX_JSON_DEPTH, limits.MAX_RECORD_BYTES):
        assert re.search(rf"\b{value:,}\b|\b{value}\b", CONTRACT), value


def _produce_murmur2_random(bootstrap: str, topic: str,
                            records: list[tuple[bytes, bytes]]) -> dict[bytes, int]:
    from confluent_kafka import Producer

    landed: dict[bytes, int] = {}
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            landed[msg.key()] = msg.partition()

    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                  "enable.idempotence": True, "acks": "all"})
    for key, value in records:
        p.produce(topic, value, key=key, on_delivery=report)
    assert p.flush(60) == 0 and not errors, errors
    return landed


async def test_librdkafka_murmur2_random_matches_the_vectors(bootstrap: str, make_topic) -> None:
    records = {bytes.fromhex(v["route_key_hex"]): bytes.fromhex(v["envelope_hex"]) for v in VALID}
    expected = {n: {bytes.fromhex(v["route_key_hex"]): v["partitions"][str(n)] for v in VALID}
                for n in VECTORS["partition_counts"]}
    for n in VECTORS["partition_counts"]:
        topic = await make_topic(f"vec{n}", partitions=n)
        landed = await asyncio.to_thread(_produce_murmur2_random, bootstrap, topic, list(records.items()))
        assert landed == expected[n], n
        stored = {r.key: r.partition for r in await read_topic(bootstrap, topic)}
        assert stored == expected[n], n
