"""Transitions in the schema-registry wire format (the Confluent framing), writer beside reader.

Wire format of a transition on a topic whose format is ``registry``::

    byte 0      magic 0x00
    bytes 1..4  the writer schema's id in the registry, big-endian (unsigned)
    bytes 5..   Avro binary encoding of the record with that writer schema

This is what the standard registry serializers of Java, Go, .NET and Python clients write, and
what registry-aware tools decode. The schema id names a schema in *the registry*, not one of
ours, so the reader needs the writer schema (:class:`WriterSchema`, fetched by the worker through
:mod:`streamsched.kafka.registry`) and reads with Avro schema resolution against our transition
schema (``schemas/transition.avsc``): a writer schema that evolved compatibly (an added field, a
removed field that has a default here) is accepted.

Every rule of the streamsched envelope holds here too: the same size bound, the same field bounds
and origin check (:func:`~streamsched.wire.transition.transition_problem`), and only fixed,
payload-free reasons. A writer schema equal to ours (Parsing Canonical Form) is read by the same
one-pass canonical reader as the envelope; another one by fastavro's resolving reader.
"""

from __future__ import annotations

import functools
import io
import json
import struct
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import fastavro
from fastavro.schema import to_parsing_canonical_form

from streamsched.errors import ConfigError, DecodeError
from streamsched.model.event import TransitionEvent
from streamsched.model.jsonval import Buffer, as_bytes
from streamsched.model.limits import MAX_RECORD_BYTES
from streamsched.wire.avro import get_codec
from streamsched.wire.avro_schema import MAGIC, parsed_schema, schema_dir
from streamsched.wire.transition import decode_transition, encode_transition, event_from_record

__all__ = ["FORMATS", "REGISTRY_MAGIC", "WireFormat", "WriterSchema", "check_format", "decode_registry",
           "encode_registry", "frame", "resolves", "schema_id_of", "subject_for", "transition_schema_text",
           "writer_schema"]

WireFormat = Literal["streamsched", "registry"]
FORMATS: Final[tuple[WireFormat, ...]] = ("streamsched", "registry")
REGISTRY_MAGIC: Final = 0
_HEADER: Final = struct.Struct(">BI")
MAX_SCHEMA_ID: Final = 2**32 - 1

UNKNOWN_SCHEMA = "schema: unknown schema id"
UNRESOLVABLE = "schema: the writer schema does not resolve against the transition schema"
UNPARSEABLE = "schema: the registry's schema is not a valid Avro schema"


def check_format(value: object, where: str) -> WireFormat:
    """``value`` as a wire format, or a :class:`ConfigError` naming ``where`` and the choices."""
    if value not in FORMATS:
        raise ConfigError(f"{where}: wire format must be one of {', '.join(FORMATS)}, not {value!r}")
    return value


def subject_for(topic: str) -> str:
    """The subject of a topic's record values under the TopicNameStrategy."""
    return f"{topic}-value"


@functools.cache
def transition_schema_text() -> str:
    """Our transition schema as registered: the ``.avsc`` file's JSON, compacted (the registry
    compares texts, so every streamsched producer registers exactly this one)."""
    doc = json.loads((schema_dir() / "transition.avsc").read_text())
    return json.dumps(doc, separators=(",", ":"))


@functools.cache
def _ours_canonical() -> str:
    return to_parsing_canonical_form(parsed_schema("transition"))


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A writer schema the registry holds under ``schema_id``, parsed once."""

    schema_id: int
    parsed: Any = None
    """fastavro's parsed schema (None when the schema is ours: the canonical reader reads it)."""
    problem: str | None = None
    """Why records written with it are dead letters (unknown id, unparseable, unresolvable)."""


def writer_schema(schema_id: int, text: str | None) -> WriterSchema:
    """Parse the registry's answer for ``schema_id`` (None: the registry does not know the id)."""
    if text is None:
        return WriterSchema(schema_id, problem=UNKNOWN_SCHEMA)
    try:
        parsed = fastavro.parse_schema(json.loads(text), _write_hint=False)
        canonical = to_parsing_canonical_form(parsed)
    except Exception:  # noqa: BLE001 - any malformed schema text is the registry's, never a crash
        return WriterSchema(schema_id, problem=UNPARSEABLE)
    if canonical == _ours_canonical():
        return WriterSchema(schema_id)
    if not isinstance(parsed, dict) or parsed.get("type") != "record" or not resolves(parsed):
        return WriterSchema(schema_id, problem=UNRESOLVABLE)
    return WriterSchema(schema_id, parsed=parsed)


def resolves(writer: Any, *, samples: int = 8) -> bool:
    """Whether records written with ``writer`` (parsed) read as transitions: sample records of
    the writer schema are written and read back with resolution. What resolution refuses is
    structural (a field we need that the writer lacks and we give no default, a type that does
    not promote), so a few samples find it; a union branch only some samples take is why there
    are several."""
    from fastavro.utils import generate_many

    try:
        for datum in generate_many(writer, samples):
            stream = io.BytesIO()
            fastavro.schemaless_writer(stream, writer, datum)
            stream.seek(0)
            fastavro.schemaless_reader(stream, writer, parsed_schema("transition"))
    except fastavro.read.SchemaResolutionError:
        return False
    except Exception:  # noqa: BLE001 - a sample our bounds refuse is not a resolution failure
        return True
    return True


def frame(schema_id: int, body: bytes) -> bytes:
    if not 0 <= schema_id <= MAX_SCHEMA_ID:
        raise ConfigError(f"schema id {schema_id} is outside 0..{MAX_SCHEMA_ID}")
    return _HEADER.pack(REGISTRY_MAGIC, schema_id) + body


def schema_id_of(data: Buffer | None) -> int | None:
    """The schema id of registry-framed bytes (None: too short or another magic byte)."""
    if data is None or len(data) < _HEADER.size or data[0] != REGISTRY_MAGIC:
        return None
    return cast(int, _HEADER.unpack_from(data)[1])


def encode_registry(ev: TransitionEvent, schema_id: int) -> bytes:
    """``ev`` framed for the registry under ``schema_id`` (the id of our transition schema in
    the registry); refuses anything :func:`decode_registry` would reject, as the envelope does."""
    body = encode_transition(ev)[2:]  # the same validated Avro body, without our envelope
    if len(body) + _HEADER.size > MAX_RECORD_BYTES:
        raise DecodeError("encode: oversize")
    return frame(schema_id, body)


def decode_registry(data: Buffer, schema: WriterSchema) -> TransitionEvent:
    """Decode registry-framed bytes written with ``schema``; raises only :class:`DecodeError`
    (the envelope's reasons, and ``schema: ...`` ones for a writer schema we cannot read)."""
    buf = as_bytes(data, MAX_RECORD_BYTES)
    if isinstance(buf, str):
        raise DecodeError(buf)
    if schema_id_of(buf) != schema.schema_id:
        raise DecodeError("bad magic")
    if schema.problem is not None:
        raise DecodeError(schema.problem)
    if schema.parsed is None:
        # Our own schema: the envelope's one-pass reader, with its canonical-encoding checks.
        return decode_transition(bytes((MAGIC, get_codec("transition").schema_id)) + buf[_HEADER.size:])
    record = _resolve(buf, schema.parsed)
    if isinstance(record, str):
        raise DecodeError(record)  # outside the except: no fastavro exception as __context__
    # Resolved against our schema, its fields have our types: the envelope's bounds remain.
    return event_from_record(record)


def _resolve(buf: bytes, writer: Any) -> dict[str, Any] | str:
    stream = io.BytesIO(buf)
    stream.seek(_HEADER.size)
    try:
        record = fastavro.schemaless_reader(stream, writer, parsed_schema("transition"))
    except fastavro.read.SchemaResolutionError:
        return UNRESOLVABLE
    except (EOFError, IndexError, struct.error):
        return "truncated"
    except UnicodeDecodeError:
        return "invalid utf-8"
    except Exception:  # noqa: BLE001 - the contract is a typed error, never a crash
        return "invalid avro"
    if stream.tell() != len(buf):
        return "trailing bytes"
    return cast(dict[str, Any], record)
