"""Wire codecs: round trips, canonical decoding, bounds, redaction and interoperability.

Interoperability is checked against the reference ``avro`` package: whatever fastavro writes
(minus the two-byte envelope) must read back identically through ``avro.io.DatumReader``, and
what the reference writer produces must be accepted by our decoder.
"""

from __future__ import annotations

import functools
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pytest
from avro_strategies import INT64, avro_values, zigzag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsched.errors import ConfigError, DecodeError
from streamsched.model.event import MAX_EVENT_TYPE_LENGTH, TransitionEvent
from streamsched.model.jsonval import json_dumps, json_loads
from streamsched.model.limits import (
    MAX_DEAD_LETTER_BYTES,
    MAX_EVENT_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_RECORD_BYTES,
    MAX_TARGET_COMPONENTS,
)
from streamsched.testing import make_event
from streamsched.wire import avro as codecs
from streamsched.wire.avro import MAGIC, SCHEMA_IDS, AvroCodec, get_codec, schema_dir
from streamsched.wire.transition import decode_transition, encode_transition

NAMES = sorted(SCHEMA_IDS, key=SCHEMA_IDS.__getitem__)
SECRET = "SECRET-MARKER-7f3a9c"

OUTCOME = {
    "kind": "FAILED",
    "fence": 7,
    "at_ns": 1_700_000_000_000_000_000,
    "events": 2,
    "digest": bytes(range(32)),
    "error_kind": "timeout",
}
SAMPLES: dict[str, dict[str, Any]] = {
    "transition": {
        "event_id": "ev-1",
        "type": "order.placed",
        "tenant": "acme",
        "target": ["orders", "o-42"],
        "due_ns": 1_700_000_000_000_000_000,
        "payload": b'{"amount":12,"currency":"EUR"}',
        "produced_ns": 1_700_000_000_000_000_001,
        "attempt": 3,
        "origin": "sched:default:nightly:4:1700000000000000000",
    },
    "claim": {
        "identity": "id-1",
        "status": "OUTCOME_STORED",
        "owner": "worker-a",
        "fence": 7,
        "lease_expires_ns": 2**62,
        "ordinal": 0,
        "revision": 12,
        "outcome": OUTCOME,
        "attempt": 2,
        "run": 3,
        "retry_due_ns": 0,
    },
    "outcome": OUTCOME,
    "schedule_definition": {
        "name": "nightly",
        "spec": "0 3 * * *",
        "target_topic": "jobs",
        "payload": b"{}",
        "version": 4,
        "enabled": True,
        "policy": "COALESCE",
        "created_ns": 5,
        "timezone": "Europe/Berlin",
        "event_type": "report",
        "tenant": "acme",
    },
    "schedule_state": {
        "schedule_id": "nightly",
        "version": 4,
        "next_planned_ns": 10,
        "last_fired_ns": None,
        "status": "ACTIVE",
        "fence": 1,
        "revision": 2,
        "name": "nightly",
        "anchor_ns": 3,
        "fired": 7,
        "skipped": 1,
        "history_seq": 9,
    },
    "history": {
        "schedule_id": "nightly",
        "occurrence": "2024-01-01T03:00",
        "planned_ns": 10,
        "attempt": 1,
        "state": "FAILED",
        "at_ns": 11,
        "cause_kind": "timeout",
        "cause_category": "transient",
    },
    "dead_letter": {
        "kind": "decode",
        "source_topic": "orders",
        "source_partition": 3,
        "source_offset": 99,
        "attempt": 1,
        "at_ns": 12,
        "reason": "truncated",
        "original": b"\xa5\x01\x00garbage",
        "original_key": b"k",
    },
}



def _reason(call: Callable[[], object]) -> str:
    with pytest.raises(DecodeError) as info:
        call()
    return info.value.reason


# --- strategies --------------------------------------------------------------------------------

TEXT = st.text(max_size=24)

json_values = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def records(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return avro_values(name, text=TEXT)


transition_events = st.builds(
    TransitionEvent,
    event_id=st.text(min_size=1, max_size=MAX_EVENT_ID_LENGTH),
    type=st.text(min_size=1, max_size=MAX_EVENT_TYPE_LENGTH),
    tenant=st.text(max_size=32),
    target=st.lists(st.text(max_size=32), max_size=MAX_TARGET_COMPONENTS).map(tuple),
    due_ns=st.integers(0, 2**63 - 1),
    payload=json_values.map(json_dumps),
    produced_ns=INT64,
    attempt=st.integers(1, 2**31 - 1),
    # A well-formed occurrence origin or none (anything else is refused: test_origin_wire.py).
    origin=st.none() | st.builds("sched:{}:{}:{}:{}".format, st.sampled_from(["default", "c-1"]),
                                 st.sampled_from(["nightly", "a.b_c"]), st.integers(0, 2**63 - 1),
                                 st.integers(-(2**63), 2**63 - 1)),
)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with a few random byte flips, insertions, deletions or a truncation."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            del data[pos:]
    return bytes(data)


def decoders() -> list[tuple[str, Callable[[bytes], object]]]:
    out: list[tuple[str, Callable[[bytes], object]]] = [(n, get_codec(n).decode) for n in NAMES]
    out.append(("decode_transition", decode_transition))
    out.append(("json_loads", json_loads))
    return out


def _only_decode_errors(data: Any) -> None:
    for name, decode in decoders():
        try:
            decode(data)
        except DecodeError:
            pass
        except Exception as exc:  # pragma: no cover - the failure path
            raise AssertionError(f"{name} raised {type(exc).__name__}") from exc


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Per-schema variants run seven times over; the fuzz suite covers them at depth.
PER_SCHEMA = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- schemas -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_schema_files_parse_standalone_with_reference_avro_and_are_documented(name: str) -> None:
    text = (schema_dir() / f"{name}.avsc").read_text()
    parsed = avro.schema.parse(text)
    assert isinstance(parsed, avro.schema.RecordSchema)
    assert parsed.namespace == "dev.streamsched"
    raw = json.loads(text)

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict) and node.get("type") == "record":
            assert node.get("doc"), node["name"]
            for field in node["fields"]:
                assert field.get("doc"), f"{node['name']}.{field['name']}"
                walk(field["type"])

    walk(raw)


def test_outcome_inlined_in_claim_is_the_standalone_outcome() -> None:
    claim = json.loads((schema_dir() / "claim.avsc").read_text())
    outcome = json.loads((schema_dir() / "outcome.avsc").read_text())
    (field,) = [f for f in claim["fields"] if f["name"] == "outcome"]
    assert field["type"] == ["null", outcome]
    assert field["default"] is None


def test_schema_dir_is_the_repository_schemas_directory() -> None:
    assert schema_dir() == Path(codecs.__file__).resolve().parent.parent.parent / "schemas"


def test_unknown_codec_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        AvroCodec("nope")


def test_get_codec_is_shared() -> None:
    assert get_codec("claim") is get_codec("claim")
    assert repr(get_codec("claim")) == "AvroCodec('claim')"


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_every_schema(name: str) -> None:
    codec = AvroCodec(name)
    data = codec.encode(SAMPLES[name])
    assert data[0] == MAGIC == 0xA5
    assert data[1] == SCHEMA_IDS[name]
    assert codec.decode(data) == SAMPLES[name]
    assert codec.encode(codec.decode(data)) == data


def test_schema_ids_are_the_documented_ones() -> None:
    assert SCHEMA_IDS == {
        "transition": 1,
        "claim": 2,
        "outcome": 3,
        "schedule_definition": 4,
        "schedule_state": 5,
        "history": 6,
        "dead_letter": 7,
    }


def test_omitted_fields_take_their_schema_defaults() -> None:
    rec = {k: v for k, v in SAMPLES["transition"].items() if k not in ("attempt", "origin")}
    decoded = AvroCodec("transition").decode(AvroCodec("transition").encode(rec))
    assert decoded["attempt"] == 1
    assert decoded["origin"] is None
    claim = {k: v for k, v in SAMPLES["claim"].items() if k != "outcome"}
    assert AvroCodec("claim").decode(AvroCodec("claim").encode(claim))["outcome"] is None


def test_encode_accepts_tuples_and_bytearrays() -> None:
    rec = {**SAMPLES["transition"], "target": ("a", "b"), "payload": bytearray(b"[]")}
    decoded = AvroCodec("transition").decode(AvroCodec("transition").encode(rec))
    assert decoded["target"] == ["a", "b"]
    assert decoded["payload"] == b"[]"


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@PER_SCHEMA
def test_property_round_trip_every_schema(name: str, data: st.DataObject) -> None:
    rec = data.draw(records(name))
    codec = get_codec(name)
    assert codec.decode(codec.encode(rec)) == rec


@given(ev=transition_events)
@FAST
def test_property_transition_round_trip(ev: TransitionEvent) -> None:
    data = encode_transition(ev)
    back = decode_transition(data)
    assert back == ev
    assert back.json() == json_loads(ev.payload)
    assert encode_transition(back) == data


@given(rec=records("claim"))
@FAST
def test_property_claim_state_round_trip(rec: dict[str, Any]) -> None:
    data = AvroCodec("claim").encode(rec)
    assert AvroCodec("claim").decode(data) == rec


# --- interoperability with the reference implementation ----------------------------------------


@functools.cache
def _reference_schema(name: str) -> Any:
    return avro.schema.parse((schema_dir() / f"{name}.avsc").read_text())


def _reference_read(name: str, body: bytes) -> Any:
    decoder = avro.io.BinaryDecoder(io.BytesIO(body))
    return avro.io.DatumReader(_reference_schema(name)).read(decoder)


def _reference_write(name: str, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    avro.io.DatumWriter(_reference_schema(name)).write(record, avro.io.BinaryEncoder(buf))
    return buf.getvalue()


@pytest.mark.parametrize("name", NAMES)
def test_reference_avro_decodes_what_we_encode(name: str) -> None:
    data = get_codec(name).encode(SAMPLES[name])
    assert _reference_read(name, data[2:]) == SAMPLES[name]


@pytest.mark.parametrize("name", NAMES)
def test_we_decode_what_reference_avro_encodes(name: str) -> None:
    body = _reference_write(name, SAMPLES[name])
    prefix = bytes((MAGIC, SCHEMA_IDS[name]))
    assert get_codec(name).decode(prefix + body) == SAMPLES[name]


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@PER_SCHEMA
def test_property_reference_avro_agrees(name: str, data: st.DataObject) -> None:
    rec = data.draw(records(name))
    encoded = get_codec(name).encode(rec)
    assert _reference_read(name, encoded[2:]) == rec
    assert _reference_write(name, rec) == encoded[2:]


# --- encode refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"extra": 1}, "encode: record: unknown field"),
        ({"fence": 2**63}, "encode: fence: long out of range"),
        ({"ordinal": 2**63}, "encode: ordinal: long out of range"),
        ({"ordinal": True}, "encode: ordinal: expected long"),
        ({"status": "GONE"}, "encode: status: not a symbol of ClaimStatus"),
        ({"owner": b"bytes"}, "encode: owner: expected string"),
        ({"owner": "\ud800"}, "encode: owner: not encodable as UTF-8"),
        ({"outcome": {**OUTCOME, "kind": "MAYBE"}}, "encode: outcome.kind: not a symbol of OutcomeKind"),
        ({"outcome": {**OUTCOME, "digest": "text"}}, "encode: outcome.digest: expected bytes"),
        ({"outcome": {k: v for k, v in OUTCOME.items() if k != "fence"}}, "encode: outcome.fence: missing"),
    ],
)
def test_encode_refusals_name_the_field_not_the_value(change: dict[str, Any], reason: str) -> None:
    assert _reason(lambda: AvroCodec("claim").encode({**SAMPLES["claim"], **change})) == reason


def test_encode_missing_required_field_and_non_mapping() -> None:
    rec = {k: v for k, v in SAMPLES["claim"].items() if k != "owner"}
    assert _reason(lambda: AvroCodec("claim").encode(rec)) == "encode: owner: missing"
    assert _reason(lambda: AvroCodec("claim").encode([1, 2])) == "encode: record: expected a record"  # type: ignore[arg-type]


def test_encode_refuses_arrays_beyond_their_bound_and_oversize_records() -> None:
    rec = {**SAMPLES["transition"], "target": ["x"] * (MAX_TARGET_COMPONENTS + 1)}
    assert _reason(lambda: AvroCodec("transition").encode(rec)) == "encode: bound: target components"
    ev = TransitionEvent("e", "t", "x", ("x",) * (MAX_TARGET_COMPONENTS + 1), 0, b"{}", 0)
    assert _reason(lambda: encode_transition(ev)) == "encode: bound: target components"
    big = {**SAMPLES["transition"], "payload": b"0" * MAX_RECORD_BYTES}
    assert _reason(lambda: AvroCodec("transition").encode(big)) == "encode: oversize"


def test_dead_letter_can_wrap_a_maximal_original_record() -> None:
    original = b"\xa5\x01" + b"x" * (MAX_RECORD_BYTES - 2)
    rec = {**SAMPLES["dead_letter"], "original": original, "original_key": b"k" * 1024}
    data = get_codec("dead_letter").encode(rec)
    assert MAX_RECORD_BYTES < len(data) <= MAX_DEAD_LETTER_BYTES
    assert get_codec("dead_letter").decode(data)["original"] == original


# --- decode refusals ---------------------------------------------------------------------------


def test_decode_reasons() -> None:
    codec = AvroCodec("claim")
    good = codec.encode(SAMPLES["claim"])
    cases: list[tuple[Any, str]] = [
        ("text", "not bytes"),
        (None, "not bytes"),
        (b"", "truncated"),
        (b"\xa5", "truncated"),
        (b"\x00" + good[1:], "bad magic"),
        (b"\xa5\x63" + good[2:], "unknown schema"),
        (b"\xa5\x01" + good[2:], "schema mismatch"),
        (good[:-1], "truncated"),
        (good + b"\x00", "trailing bytes"),
        (b"\xa5\x02" + b"\x00" * (MAX_RECORD_BYTES - 1), "oversize"),
    ]
    for data, reason in cases:
        assert _reason(functools.partial(codec.decode, data)) == reason
    assert codec.decode(bytearray(good)) == codec.decode(memoryview(good)) == SAMPLES["claim"]


def test_decode_rejects_invalid_utf8() -> None:
    good = get_codec("dead_letter").encode(SAMPLES["dead_letter"])
    kind = SAMPLES["dead_letter"]["kind"].encode()
    assert good[2:].startswith(zigzag(len(kind)) + kind)
    data = good[:2] + zigzag(2) + b"\xff\xfe" + good[3 + len(kind) :]
    assert _reason(lambda: get_codec("dead_letter").decode(data)) == "invalid utf-8"


def test_decode_rejects_encodings_fastavro_would_silently_accept() -> None:
    """Negative enum/union indices, out-of-range ints, odd booleans and overlong varints."""
    sd = get_codec("schedule_definition")
    good = sd.encode(SAMPLES["schedule_definition"])
    enabled_at = good.index(b"\x01\x02")  # enabled=True, then policy index 1 (COALESCE)
    bad_bool = good[:enabled_at] + b"\x02" + good[enabled_at + 1 :]
    assert _reason(lambda: sd.decode(bad_bool)) == "non-canonical encoding"
    neg_enum = good[: enabled_at + 1] + zigzag(-1) + good[enabled_at + 2 :]
    assert _reason(lambda: sd.decode(neg_enum)) == "non-canonical encoding"

    ss = get_codec("schedule_state")
    rec = {**SAMPLES["schedule_state"], "next_planned_ns": None, "last_fired_ns": None}
    good = ss.encode(rec)
    # version=4, next_planned_ns=null, last_fired_ns=null, ACTIVE, fence=1, revision=2
    # (the fields appended after revision follow unchanged in ``rest``)
    tail = b"\x08\x00\x00\x00\x02\x04"
    at = good.index(tail, len(b"\xa5\x05\x0enightly"))
    head, rest = good[:at], good[at + len(tail):]
    # Branch index -1 is Python's "last branch" (long) to fastavro.
    neg_union = head + b"\x08" + zigzag(-1) + zigzag(10) + tail[2:] + rest
    assert _reason(lambda: ss.decode(neg_union)) == "non-canonical encoding"
    overlong = head + b"\x88\x00" + tail[1:] + rest
    assert _reason(lambda: ss.decode(overlong)) == "non-canonical encoding"

    hist = get_codec("history")
    good = hist.encode(SAMPLES["history"])
    attempt = zigzag(SAMPLES["history"]["planned_ns"]) + zigzag(1)
    at = good.index(attempt)
    wide = good[:at] + zigzag(SAMPLES["history"]["planned_ns"]) + zigzag(2**40) + good[at + len(attempt) :]
    assert _reason(lambda: hist.decode(wide)) == "invalid avro"


def fastest(fn: Callable[[], object], tries: int) -> float:
    """The shortest of ``tries`` timings of ``fn``: a stall must hit every try to count."""
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def refusal_bound() -> float:
    """Seconds a refusal that reads no more than a few components may take: a thousand decodes
    of an ordinary record (tens of thousands of values), and never under 20 ms. Reading a hostile
    array to its claimed length (10^5 to 2^62 values) takes longer on any machine; only a stall
    lasting through every try of :func:`fastest` can push a bounded refusal past it."""
    sample = encode_transition(make_event("due", "t", ["a", "b"]))
    return max(0.02, 1000 * fastest(lambda: decode_transition(sample), 20))


@pytest.mark.parametrize("count", [MAX_TARGET_COMPONENTS + 1, 2**20, 2**62, -(2**40)])
def test_hostile_array_counts_are_refused_fast(count: int) -> None:
    bound = refusal_bound()
    head = b"\xa5\x01" + b"\x02e\x02t\x00" + zigzag(count)
    for body in (b"\x00" * (MAX_RECORD_BYTES - len(head)), b"\x02" * 64):
        decode = functools.partial(_reason, functools.partial(decode_transition, head + body))
        assert decode() == "bound: target components"
        assert fastest(decode, 5) < bound
    many_blocks = b"\xa5\x01" + b"\x02e\x02t\x00" + b"\x02\x00" * 100_000 + b"\x00"
    decode = functools.partial(_reason, functools.partial(decode_transition, many_blocks))
    assert decode() == "bound: target components"
    assert fastest(decode, 5) < bound


@given(data=st.binary(max_size=512))
@FAST
def test_property_random_bytes_only_raise_decode_error(data: bytes) -> None:
    _only_decode_errors(data)
    for sid in range(9):
        _only_decode_errors(bytes((MAGIC, sid)) + data)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@PER_SCHEMA
def test_property_mutated_encodings_only_raise_decode_error(name: str, data: st.DataObject) -> None:
    valid = get_codec(name).encode(data.draw(records(name)))
    _only_decode_errors(data.draw(mutated(valid)))


@given(data=st.data())
@FAST
def test_property_mutated_transitions_only_raise_decode_error(data: st.DataObject) -> None:
    valid = encode_transition(data.draw(transition_events))
    _only_decode_errors(data.draw(mutated(valid)))


@pytest.mark.parametrize("name", NAMES)
def test_every_truncation_is_refused(name: str) -> None:
    data = get_codec(name).encode(SAMPLES[name])
    for cut in range(len(data)):
        _reason(functools.partial(get_codec(name).decode, data[:cut]))


# --- redaction ---------------------------------------------------------------------------------


def _secret_event() -> TransitionEvent:
    return TransitionEvent(
        event_id="ev",
        type="t",
        tenant="acme",
        target=("a",),
        due_ns=0,
        payload=json_dumps({"note": SECRET, "nested": [SECRET, {"k": SECRET}]}),
        produced_ns=0,
        origin=f"sched:default:{SECRET}:1:0",
    )


def _assert_clean(err: DecodeError) -> None:
    for text in (str(err), repr(err), err.reason, repr(err.args)):
        assert SECRET not in text
        assert SECRET.encode().hex() not in text
    # Chained exceptions from fastavro/orjson carry the input (e.g. JSONDecodeError.doc).
    assert err.__cause__ is None
    assert err.__context__ is None


def test_decode_errors_never_contain_payload_text() -> None:
    data = encode_transition(_secret_event())
    variants = [data[:cut] for cut in range(len(data))]
    for pos in range(len(data)):
        for value in (0x00, 0x01, 0x80, 0xFF, data[pos] ^ 0x55):
            variants.append(data[:pos] + bytes((value,)) + data[pos + 1 :])
        variants.append(data[:pos] + b"\xff\xfe" + data[pos:])
    refused = 0
    for variant in variants:
        for _, decode in decoders():
            try:
                decode(variant)
            except DecodeError as err:
                _assert_clean(err)
                refused += 1
    assert refused > len(variants)


def test_invalid_json_errors_never_contain_payload_text() -> None:
    raw = {**SAMPLES["transition"], "payload": f'{{"x": {SECRET}'.encode()}
    data = AvroCodec("transition").encode(raw)
    with pytest.raises(DecodeError) as info:
        decode_transition(data)
    assert info.value.reason == "payload: invalid json"
    _assert_clean(info.value)
    for doc in (f'{{"x": {SECRET}', f'["{SECRET}"'.encode(), f'"{SECRET}\ud800"'):
        with pytest.raises(DecodeError) as info:
            json_loads(doc)
        _assert_clean(info.value)


def test_encode_errors_never_contain_values_or_unknown_keys() -> None:
    for rec in (
        {**SAMPLES["claim"], "owner": SECRET.encode()},
        {**SAMPLES["claim"], SECRET: 1},
        {**SAMPLES["claim"], "outcome": {**OUTCOME, SECRET: SECRET}},
        {**SAMPLES["claim"], "status": SECRET},
    ):
        with pytest.raises(DecodeError) as info:
            AvroCodec("claim").encode(rec)
        assert info.value.reason.startswith("encode: ")
        _assert_clean(info.value)
    with pytest.raises(DecodeError) as info:
        json_dumps({SECRET: object()})
    _assert_clean(info.value)


# --- transition events -------------------------------------------------------------------------


def _raw_transition(**change: Any) -> bytes:
    """Schema-valid but possibly out-of-bounds transition bytes, bypassing encode_transition."""
    return AvroCodec("transition").encode({**SAMPLES["transition"], **change})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"event_id": ""}, "bound: event_id"),
        ({"event_id": "e" * (MAX_EVENT_ID_LENGTH + 1)}, "bound: event_id"),
        ({"type": ""}, "bound: type"),
        ({"type": "t" * (MAX_EVENT_TYPE_LENGTH + 1)}, "bound: type"),
        ({"due_ns": -1}, "bound: due_ns"),
        ({"attempt": 0}, "bound: attempt"),
        ({"payload": b"1" * (MAX_PAYLOAD_BYTES + 1)}, "bound: payload size"),
        ({"payload": b"{not json"}, "payload: invalid json"),
        ({"payload": b""}, "payload: invalid json"),
        (
            {"payload": b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)},
            "payload: bound: json depth",
        ),
    ],
)
def test_transition_bounds(change: dict[str, Any], reason: str) -> None:
    assert _reason(lambda: decode_transition(_raw_transition(**change))) == reason
    rec = {**SAMPLES["transition"], **change}
    ev = TransitionEvent(**{k: v for k, v in rec.items() if k != "target"}, target=tuple(rec["target"]))
    assert _reason(lambda: encode_transition(ev)) == f"encode: {reason}"


def test_transition_bounds_are_inclusive() -> None:
    ev = decode_transition(
        _raw_transition(
            event_id="e" * MAX_EVENT_ID_LENGTH,
            type="t" * MAX_EVENT_TYPE_LENGTH,
            target=["x"] * MAX_TARGET_COMPONENTS,
            due_ns=0,
            payload=b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH,
        )
    )
    assert len(ev.target) == MAX_TARGET_COMPONENTS


def test_transition_event_fields_and_helpers() -> None:
    ev = decode_transition(_raw_transition())
    assert ev.target == ("orders", "o-42")
    assert ev.json() == {"amount": 12, "currency": "EUR"}
    assert ev.to_record() == SAMPLES["transition"]
    with pytest.raises(TypeError):
        TransitionEvent("e", "t", "x", (), 0, b"{}", 0, 2)  # type: ignore[call-arg]
    plain = TransitionEvent("e", "t", "x", (), 0, b"{}", 0)
    assert (plain.attempt, plain.origin) == (1, None)
    with pytest.raises(AttributeError):
        plain.attempt = 2  # type: ignore[misc]


def test_encode_transition_type_errors_are_decode_errors() -> None:
    ev = TransitionEvent("e", "t", "x", ("a", 1), 0, b"{}", 0)  # type: ignore[arg-type]
    assert _reason(lambda: encode_transition(ev)) == "encode: target[1]: expected string"


# --- JSON --------------------------------------------------------------------------------------


def test_json_dumps_is_canonical() -> None:
    assert json_dumps({"b": 1, "a": {"d": [1, 2], "c": None}}) == b'{"a":{"c":null,"d":[1,2]},"b":1}'
    assert json_dumps("é") == '"é"'.encode()


def test_json_dumps_refuses_unserializable() -> None:
    for value in (object(), {1: 2}, 2**70, {"x": {1}}):
        assert _reason(functools.partial(json_dumps, value)) == "encode: not JSON-serializable"


def test_json_loads_bounds_and_inputs() -> None:
    assert json_loads('{"a": [1, 2.5, "x"]}') == json_loads(b'{"a":[1,2.5,"x"]}') == {"a": [1, 2.5, "x"]}
    assert json_loads(bytearray(b"[]")) == json_loads(memoryview(b"[]")) == []
    assert json_loads(b"1") == 1
    deep_ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert json_loads(deep_ok) is not None
    too_deep = b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1)
    assert _reason(lambda: json_loads(too_deep)) == "bound: json depth"
    very_deep = b"[" * 100_000 + b"]" * 100_000
    assert _reason(lambda: json_loads(very_deep[:MAX_PAYLOAD_BYTES])) == "invalid json"
    assert _reason(lambda: json_loads(b" " * (MAX_PAYLOAD_BYTES + 1))) == "bound: json size"
    assert _reason(lambda: json_loads(" " * (MAX_PAYLOAD_BYTES + 1))) == "bound: json size"
    assert _reason(lambda: json_loads(12)) == "not bytes"  # type: ignore[arg-type]
    assert _reason(lambda: json_loads("\ud800")) == "invalid json"
    assert _reason(lambda: json_loads(b"NaN")) == "invalid json"


def test_json_depth_check_accepts_wide_shallow_documents() -> None:
    # Width is not depth: 80,001 sibling lists are two levels deep. (Its speed is a benchmark
    # matter, not a unit-test assertion.)
    wide = b"[" + b"[]," * 80_000 + b"[]]"
    parsed = json_loads(wide)
    assert isinstance(parsed, list) and len(parsed) == 80_001


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_nested = st.recursive(st.sampled_from([0, "{", "[[", "]}", None]),
                       lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner,
                                                                                  max_size=2),
                       max_leaves=90)


@given(value=_nested, wrap=st.integers(0, MAX_JSON_DEPTH + 2))
@FAST
def test_property_json_depth_verdict_matches_the_nesting(value: object, wrap: int) -> None:
    # Brackets inside strings count in the bracket pre-check (jsonval.py) but never as depth.
    for _ in range(wrap):
        value = [value]
    data = json.dumps(value).encode()
    if _depth(value) > MAX_JSON_DEPTH:
        assert _reason(lambda: json_loads(data)) == "bound: json depth"
    else:
        assert json_loads(data) == value


@given(value=json_values)
@FAST
def test_property_json_round_trip(value: object) -> None:
    data = json_dumps(value)
    assert json_loads(data) == value
    assert json_dumps(json_loads(data)) == data


@given(data=st.binary(max_size=256) | st.text(max_size=256))
@FAST
def test_property_json_loads_only_raises_decode_error(data: bytes | str) -> None:
    try:
        json_loads(data)
    except DecodeError as err:
        assert err.__context__ is None
