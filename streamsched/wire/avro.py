"""Avro records with a two-byte envelope: the codec every wire format of streamsched uses.

Wire format of every Avro record streamsched writes::

    byte 0      magic 0xA5
    byte 1      schema id: 1 transition, 2 claim, 3 outcome, 4 schedule_definition,
                5 schedule_state, 6 history, 7 dead_letter
    byte 2..    Avro binary encoding of the record (schemaless: no container header, no
                writer-schema fingerprint; the schema id names the schema)

The schemas are the ``*.avsc`` files in the repository's top-level ``schemas/`` directory (or
``streamsched/_schemas`` in a wheel install). They are parsed once, on first use.

Decoding is total: :meth:`AvroCodec.decode` (and the decoders built on it, such as
:func:`~streamsched.wire.transition.decode_transition`) raises nothing but
:class:`~streamsched.errors.DecodeError` for any input, and its ``reason`` is always one of a few
fixed, payload-free strings. A decoded record is also *canonical*: it re-encodes to exactly the
input bytes; non-canonical encodings that fastavro accepts silently are refused.

This module is the codec (envelope, encode, decode dispatch) and the public names; the concepts
behind it live beside it and are re-exported or used from here:

* :mod:`~streamsched.wire.avro_schema`: schema ids, the magic byte, per-codec bounds, loading;
* :mod:`~streamsched.wire.avro_conform`: conformance of a record to its schema, with
  payload-free reasons, and the validated encoding (:meth:`AvroCodec.encode`);
* :mod:`~streamsched.wire.avro_reader`: the one-pass canonical reader every shipped schema is
  compiled into (the decode hot path);
* :mod:`~streamsched.wire.avro_fallback`: the three-pass path (fastavro reader + validating
  re-encode + byte comparison) for a schema the one-pass reader does not compile.

JSON payloads are serialized by :func:`~streamsched.model.jsonval.json_dumps` with sorted keys,
so equal documents have equal bytes.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from typing import Any, Final, cast

import fastavro

from streamsched.errors import ConfigError, DecodeError
from streamsched.model.jsonval import Buffer, as_bytes
from streamsched.model.limits import MAX_RECORD_BYTES
from streamsched.wire.avro_conform import validated_body
from streamsched.wire.avro_fallback import decode_three_pass
from streamsched.wire.avro_reader import Refused, reader_for
from streamsched.wire.avro_schema import (
    ARRAY_BOUNDS,
    KNOWN_IDS,
    MAGIC,
    SCHEMA_IDS,
    SIZE_LIMITS,
    parsed_schema,
    schema_dir,
)

__all__ = ["MAGIC", "SCHEMA_IDS", "AvroCodec", "get_codec", "schema_dir"]


class AvroCodec:
    """Encoder/decoder of one record type in the streamsched wire format (see module docs).

    ``AvroCodec("claim")`` handles ``schemas/claim.avsc``; names are the keys of
    :data:`SCHEMA_IDS`. Instances are immutable and safe to share; :func:`get_codec` caches
    one per name. ``max_bytes`` is the largest encoding accepted: ``MAX_RECORD_BYTES``, or
    ``MAX_DEAD_LETTER_BYTES`` for ``dead_letter`` (it wraps a whole original record).
    """

    __slots__ = ("_bounds", "_named", "_prefix", "_reader", "_schema", "max_bytes", "name", "schema_id")

    def __init__(self, name: str) -> None:
        if name not in SCHEMA_IDS:
            raise ConfigError(f"unknown Avro codec {name!r}")
        self.name: Final = name
        self.schema_id: Final = SCHEMA_IDS[name]
        self._prefix = bytes((MAGIC, self.schema_id))
        self._schema = parsed_schema(name)
        self._named: Mapping[str, Any] = self._schema["__named_schemas"]
        self._bounds = ARRAY_BOUNDS.get(name, ())
        self._reader = reader_for(self._schema, self._bounds)
        self.max_bytes: Final = SIZE_LIMITS.get(name, MAX_RECORD_BYTES)

    def __repr__(self) -> str:
        return f"AvroCodec({self.name!r})"

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Validate ``record`` against the schema and return its wire bytes.

        Fields with a schema default may be omitted. Raises :class:`DecodeError` with reason
        ``"encode: <field path>: <problem>"`` (never the value itself), or ``"encode: oversize"``
        when the result would exceed :attr:`max_bytes` and so be undecodable.
        """
        body = validated_body(self._schema, self._named, self._bounds, record)
        if isinstance(body, str):
            raise DecodeError(f"encode: {body}")
        if len(body) + 2 > self.max_bytes:
            raise DecodeError("encode: oversize")
        return self._prefix + body

    def encode_trusted(self, record: Mapping[str, Any]) -> bytes:
        """Encode a record that streamsched itself built from typed values, skipping the field
        checker (which costs more than the encoding). Use :meth:`encode` for anything that came
        from outside; a malformed record still fails, as ``DecodeError("encode: invalid")``."""
        buf = io.BytesIO()
        buf.write(self._prefix)
        try:
            fastavro.schemaless_writer(buf, self._schema, record)
        except Exception:  # noqa: BLE001 - the contract is a typed error, never a crash
            failed = True
        else:
            failed = False
        if failed:
            raise DecodeError("encode: invalid")
        out = buf.getvalue()
        if len(out) > self.max_bytes:
            raise DecodeError("encode: oversize")
        return out

    def decode(self, data: Buffer) -> dict[str, Any]:
        """Decode wire bytes into a record dict; raises only :class:`DecodeError`.

        Reasons: ``"not bytes"``, ``"oversize"``, ``"truncated"``, ``"bad magic"``,
        ``"unknown schema"``, ``"schema mismatch"``, ``"invalid utf-8"``, ``"invalid avro"``,
        ``"trailing bytes"``, ``"non-canonical encoding"``, and ``"bound: ..."`` for an array
        longer than its bound (transition ``target``).
        """
        result = self._decode(data)
        if isinstance(result, str):
            # Raised outside any ``except`` so no fastavro exception (whose args or attributes
            # may hold input bytes) is attached as __context__.
            raise DecodeError(result)
        return result

    def _decode(self, data: object) -> dict[str, Any] | str:
        buf = as_bytes(data, self.max_bytes)
        if isinstance(buf, str):
            return buf
        if len(buf) < 2:
            return "truncated"
        if buf[0] != MAGIC:
            return "bad magic"
        if buf[1] != self.schema_id:
            return "schema mismatch" if buf[1] in KNOWN_IDS else "unknown schema"
        if self._reader is not None:
            return self._read(buf)
        return self._decode_three_pass(buf)

    def _read(self, buf: bytes) -> dict[str, Any] | str:
        """One pass: decode, bound-check and refuse non-canonical bytes as they are read."""
        assert self._reader is not None
        try:
            record, end = self._reader(buf, 2)
        except Refused as exc:
            return exc.reason
        except IndexError:
            return "truncated"
        except UnicodeDecodeError:
            return "invalid utf-8"
        except Exception:  # noqa: BLE001 - the contract is a typed error, never a crash
            return "invalid avro"
        if end != len(buf):
            return "trailing bytes"
        return cast(dict[str, Any], record)

    def _decode_three_pass(self, buf: bytes) -> dict[str, Any] | str:
        """The three-pass path (schemas the one-pass reader does not compile)."""
        return decode_three_pass(buf, self._schema, self._named, self._bounds)


@functools.cache
def get_codec(name: str) -> AvroCodec:
    """The shared :class:`AvroCodec` for ``name`` (one of :data:`SCHEMA_IDS`)."""
    return AvroCodec(name)
