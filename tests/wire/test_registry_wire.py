"""The schema-registry wire format: framing, schema resolution, and decoding that is total."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import ConfigError, DecodeError
from streamsched.model.event import TransitionEvent
from streamsched.model.limits import MAX_TARGET_COMPONENTS
from streamsched.testing import make_event
from streamsched.wire.registry import (
    UNKNOWN_SCHEMA,
    UNRESOLVABLE,
    decode_registry,
    encode_registry,
    frame,
    schema_id_of,
    subject_for,
    transition_schema_text,
    writer_schema,
)
from streamsched.wire.transition import encode_transition

OURS = json.loads(transition_schema_text())

events = st.builds(
    make_event,
    st.text(min_size=1, max_size=16),
    st.text(max_size=16),
    st.lists(st.text(max_size=16), max_size=MAX_TARGET_COMPONENTS),
    due_ns=st.integers(0, 2**63 - 1),
)


def schema_with(change: Any) -> dict[str, Any]:
    doc = json.loads(transition_schema_text())
    change(doc["fields"])
    return doc


def written(doc: dict[str, Any], schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(doc), record)
    return frame(schema_id, out.getvalue())


EVOLVED = schema_with(lambda f: f.append({"name": "trace_id", "type": ["null", "string"], "default": None}))


@given(events, st.integers(0, 2**32 - 1))
def test_our_schema_round_trips_under_any_id(ev: TransitionEvent, schema_id: int) -> None:
    data = encode_registry(ev, schema_id)
    assert data[0] == 0 and schema_id_of(data) == schema_id
    # The body is exactly our envelope's Avro body: any registry-aware reader of our schema reads it.
    assert data[5:] == encode_transition(ev)[2:]
    assert decode_registry(data, writer_schema(schema_id, transition_schema_text())) == ev


@given(events)
def test_an_evolved_writer_schema_is_read_by_resolution(ev: TransitionEvent) -> None:
    record = {**ev.to_record(), "trace_id": "abc"}
    schema = writer_schema(42, json.dumps(EVOLVED))
    assert schema.problem is None and schema.parsed is not None
    assert decode_registry(written(EVOLVED, 42, record), schema) == ev


def test_a_writer_schema_without_a_field_we_need_is_a_schema_dead_letter() -> None:
    no_tenant = schema_with(lambda f: f.remove(next(x for x in f if x["name"] == "tenant")))
    schema = writer_schema(7, json.dumps(no_tenant))
    assert schema.problem == UNRESOLVABLE
    record = {k: v for k, v in make_event("due", "t", ["a"]).to_record().items() if k != "tenant"}
    with pytest.raises(DecodeError) as info:
        decode_registry(written(no_tenant, 7, record), schema)
    assert info.value.reason == UNRESOLVABLE


def test_a_field_we_default_may_be_missing_from_the_writer() -> None:
    no_attempt = schema_with(lambda f: f.remove(next(x for x in f if x["name"] == "attempt")))
    ev = make_event("due", "t", ["a"])
    record = {k: v for k, v in ev.to_record().items() if k != "attempt"}
    decoded = decode_registry(written(no_attempt, 3, record), writer_schema(3, json.dumps(no_attempt)))
    assert decoded.attempt == 1


def test_unknown_ids_and_unparseable_schemas_are_schema_reasons() -> None:
    data = encode_registry(make_event("due", "t", ["a"]), 9)
    for text, reason in ((None, UNKNOWN_SCHEMA), ("{not json", "schema: the registry's schema is not "
                                                                "a valid Avro schema")):
        with pytest.raises(DecodeError) as info:
            decode_registry(data, writer_schema(9, text))
        assert info.value.reason == reason


def test_the_bounds_of_the_envelope_hold_for_resolved_records() -> None:
    # A target longer than its bound, written by a schema other than ours: refused as a bound.
    ev = make_event("due", "t", ["a"])
    record = {**ev.to_record(), "target": ["x"] * (MAX_TARGET_COMPONENTS + 1), "trace_id": None}
    with pytest.raises(DecodeError) as info:
        decode_registry(written(EVOLVED, 5, record), writer_schema(5, json.dumps(EVOLVED)))
    assert info.value.reason.startswith("bound")


@given(st.binary(max_size=64), st.integers(0, 2**32 - 1))
def test_decoding_any_bytes_raises_only_decode_errors(body: bytes, schema_id: int) -> None:
    for schema in (writer_schema(schema_id, transition_schema_text()),
                   writer_schema(schema_id, json.dumps(EVOLVED))):
        try:
            decode_registry(frame(schema_id, body), schema)
        except DecodeError as exc:  # anything else fails the test
            assert len(exc.reason) < 100 and (len(body) < 4 or body.hex() not in exc.reason)


def test_framing_is_checked() -> None:
    assert schema_id_of(b"\x00\x00\x00") is None and schema_id_of(b"\xa5\x01\x00\x00\x00\x01") is None
    with pytest.raises(ConfigError):
        frame(2**32, b"")
    with pytest.raises(DecodeError):
        decode_registry(b"\xa5\x01", writer_schema(1, transition_schema_text()))
    assert subject_for("invoices") == "invoices-value"
