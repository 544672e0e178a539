"""Avro records with a two-byte envelope: the codec every wire format of streamsched uses.

Wire format of every Avro record streamsched writes::

    byte 0      magic 0xA5
    byte 1      schema id: 1 transition, 2 claim, 3 outcome, 4 schedule_definition,
                5 schedule_state, 6 history, 7 dead_letter
    byte 2..    Avro binary encoding of the record (schemaless: no container header, no
                writer-schema fingerprint; the schema id names the schema)

The schemas are the ``*.avsc`` files in the repository's top-level ``schemas/`` directory (or
``streamsched/_schemas`` in a wheel install). They are parsed once, on first use.

Decoding is total: :meth:`AvroCodec.decode`, :func:`decode_transition` and :func:`json_loads`
raise nothing but :class:`~streamsched.errors.DecodeError` for any input, and its ``reason`` is
always one of a few fixed, payload-free strings. A decoded record is also *canonical*: it
re-encodes to exactly the input bytes, so negative enum/union indices, out-of-range ints,
overlong varints, non-0/1 booleans and arrays in several or size-prefixed blocks (all of which
fastavro accepts silently) are rejected.

Canonical form is checked in the decoder's own pass, not by re-encoding: every schema is
compiled once into a small reader per field (:func:`_compile`) that refuses a non-canonical
encoding where it reads it. That replaced fastavro's reader + a validating re-encode + a byte
comparison, three passes that cost more than the rest of the worker's turn (py-spy, issue 10).
A schema using a type the compiler does not know (float, double, map, fixed, a union other than
``null`` + one type) keeps the old three-pass path, so the codec stays total either way.

JSON payloads are serialized by :func:`json_dumps` with sorted keys, so equal documents have
equal bytes.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import fastavro

from streamsched.errors import ConfigError, DecodeError
from streamsched.model.jsonval import Buffer, as_bytes
from streamsched.model.limits import MAX_DEAD_LETTER_BYTES, MAX_RECORD_BYTES, MAX_TARGET_COMPONENTS

__all__ = ["MAGIC", "SCHEMA_IDS", "AvroCodec", "get_codec", "schema_dir"]

MAGIC: Final = 0xA5
"""First byte of every encoded record."""

SCHEMA_IDS: Final[Mapping[str, int]] = {
    "transition": 1,
    "claim": 2,
    "outcome": 3,
    "schedule_definition": 4,
    "schedule_state": 5,
    "history": 6,
    "dead_letter": 7,
}
"""Codec name (and ``schemas/<name>.avsc`` file stem) to the schema-id byte."""

_RECORD_NAMES: Final[Mapping[str, str]] = {
    "transition": "dev.streamsched.TransitionEvent",
    "claim": "dev.streamsched.ClaimState",
    "outcome": "dev.streamsched.Outcome",
    "schedule_definition": "dev.streamsched.ScheduleDefinition",
    "schedule_state": "dev.streamsched.ScheduleState",
    "history": "dev.streamsched.HistoryRow",
    "dead_letter": "dev.streamsched.DeadLetter",
}
_KNOWN_IDS: Final = frozenset(SCHEMA_IDS.values())

_SIZE_LIMITS: Final[Mapping[str, int]] = {"dead_letter": MAX_DEAD_LETTER_BYTES}
"""Encoded-size bound per codec where it differs from ``MAX_RECORD_BYTES``."""

_ARRAY_BOUNDS: Final[Mapping[str, tuple[tuple[str, int, str], ...]]] = {
    "transition": (("target", MAX_TARGET_COMPONENTS, "bound: target components"),),
}
"""Per codec: (top-level array field, max items, reason). Enforced by encode and decode."""



_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


# --------------------------------------------------------------------------------------------
# Schemas


def schema_dir() -> Path:
    """Directory the ``*.avsc`` files are loaded from."""
    here = Path(__file__).resolve().parent
    repo = here.parent.parent / "schemas"
    packaged = here.parent / "_schemas"
    if not repo.is_dir() and packaged.is_dir():
        return packaged
    return repo


@functools.cache
def _parsed_schema(name: str) -> dict[str, Any]:
    path = schema_dir() / f"{name}.avsc"
    with path.open("rb") as fh:
        raw = json.load(fh)
    parsed = cast(dict[str, Any], fastavro.parse_schema(raw, named_schemas={}))
    if parsed.get("name") != _RECORD_NAMES[name]:
        # A renamed or swapped file would otherwise pair a schema id with the wrong layout.
        raise ConfigError(f"{path.name} defines {parsed.get('name')!r}, expected {_RECORD_NAMES[name]!r}")
    return parsed


# --------------------------------------------------------------------------------------------
# Record conformance (shared by encode and the canonical check of decode)


class _Invalid(Exception):
    """Internal: a datum does not fit the schema; ``reason`` is already payload-free."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _conform(schema: Any, datum: Any, path: str, named: Mapping[str, Any]) -> Any:
    """Return ``datum`` in the exact shape fastavro writes, or raise :class:`_Invalid`.

    fastavro's own validation misses unknown record keys, coerces some types and its error
    messages embed the datum, so the checks are done here with reasons that name only
    schema fields and positions.
    """
    where = path or "record"
    if isinstance(schema, str):
        if schema in named:
            return _conform(named[schema], datum, path, named)
        return _conform_primitive(schema, datum, where)
    if isinstance(schema, list):
        if datum is None and "null" in schema:
            return None
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            # The common ["null", X] case: X's own reason is more useful than "no branch".
            return _conform(branches[0], datum, path, named)
        for branch in branches:
            try:
                return _conform(branch, datum, path, named)
            except _Invalid:
                continue
        raise _Invalid(f"{where}: matches no union branch")
    kind = schema["type"]
    if kind == "record":
        if not isinstance(datum, Mapping):
            raise _Invalid(f"{where}: expected a record")
        fields = schema["fields"]
        names = {f["name"] for f in fields}
        # Unknown keys are reported without their name: keys can come from caller data.
        if any(key not in names for key in datum):
            raise _Invalid(f"{where}: unknown field")
        out: dict[str, Any] = {}
        for f in fields:
            fname = f["name"]
            if fname in datum:
                value = datum[fname]
            elif "default" in f:
                value = f["default"]
            else:
                raise _Invalid(f"{_join(path, fname)}: missing")
            out[fname] = _conform(f["type"], value, _join(path, fname), named)
        return out
    if kind == "enum":
        if not isinstance(datum, str) or datum not in schema["symbols"]:
            raise _Invalid(f"{where}: not a symbol of {schema['name'].rsplit('.', 1)[-1]}")
        return datum
    if kind == "array":
        if isinstance(datum, str | bytes | bytearray | Mapping) or not isinstance(datum, Sequence):
            raise _Invalid(f"{where}: expected an array")
        return [_conform(schema["items"], item, f"{where}[{i}]", named) for i, item in enumerate(datum)]
    if kind == "map":
        if not isinstance(datum, Mapping):
            raise _Invalid(f"{where}: expected a map")
        if not all(isinstance(k, str) for k in datum):
            raise _Invalid(f"{where}: map keys must be strings")
        return {k: _conform(schema["values"], v, f"{where}[]", named) for k, v in datum.items()}
    if kind == "fixed":
        if not isinstance(datum, bytes | bytearray) or len(datum) != schema["size"]:
            raise _Invalid(f"{where}: expected {schema['size']} bytes")
        return bytes(datum)
    return _conform_primitive(kind, datum, where)


def _conform_primitive(kind: str, datum: Any, where: str) -> Any:
    if kind == "null":
        if datum is not None:
            raise _Invalid(f"{where}: expected null")
        return None
    if kind == "boolean":
        if not isinstance(datum, bool):
            raise _Invalid(f"{where}: expected boolean")
        return datum
    if kind in ("int", "long"):
        low, high = _INT32 if kind == "int" else _INT64
        if isinstance(datum, bool) or not isinstance(datum, int):
            raise _Invalid(f"{where}: expected {kind}")
        if not low <= datum <= high:
            raise _Invalid(f"{where}: {kind} out of range")
        return datum
    if kind in ("float", "double"):
        if isinstance(datum, bool) or not isinstance(datum, int | float):
            raise _Invalid(f"{where}: expected {kind}")
        return float(datum)
    if kind == "bytes":
        if not isinstance(datum, bytes | bytearray | memoryview):
            raise _Invalid(f"{where}: expected bytes")
        return bytes(datum)
    if kind == "string":
        if not isinstance(datum, str):
            raise _Invalid(f"{where}: expected string")
        if not datum.isascii():
            try:
                datum.encode("utf-8")
            except UnicodeEncodeError:
                raise _Invalid(f"{where}: not encodable as UTF-8") from None
        return datum
    raise _Invalid(f"{where}: unsupported schema type")


# --------------------------------------------------------------------------------------------
# Avro codec


_SKIPPABLE: Final = frozenset({"string", "bytes", "int", "long"})


def _varint(buf: bytes, pos: int) -> tuple[int, int] | None:
    """Zigzag varint at ``pos`` and the position after it; ``None`` if truncated or overlong."""
    result = shift = 0
    end = min(len(buf), pos + 10)
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    return None


def _skip(kind: str, buf: bytes, pos: int) -> int | None:
    step = _varint(buf, pos)
    if step is None:
        return None
    value, pos = step
    if kind in ("string", "bytes"):
        return pos + value if value >= 0 else None
    return pos


def _array_exceeds(buf: bytes, pos: int, fields: list[dict[str, Any]], name: str, limit: int) -> bool:
    """True only if the encoded array field ``name`` certainly holds more than ``limit`` items.

    fastavro materialises every item of a hostile array (a 264 KB record can declare ~260,000
    empty strings) before any bound can be checked; this walks just far enough to count, and
    answers False whenever the layout is not simple enough to walk, leaving errors to fastavro.
    """
    for field in fields:
        kind = field["type"]
        if field["name"] == name:
            break
        if kind not in _SKIPPABLE:
            return False
        skipped = _skip(kind, buf, pos)
        if skipped is None:
            return False
        pos = skipped
    else:
        return False
    items = kind["items"] if isinstance(kind, dict) and kind.get("type") == "array" else None
    if items not in _SKIPPABLE:
        return False
    count = 0
    while True:
        step = _varint(buf, pos)
        if step is None:
            return False
        block, pos = step
        if block == 0:
            return False
        if block < 0:
            block = -block
            size = _varint(buf, pos)
            if size is None:
                return False
            pos = size[1]
        count += block
        if count > limit:
            return True
        for _ in range(block):
            skipped = _skip(items, buf, pos)
            if skipped is None:
                return False
            pos = skipped


# --------------------------------------------------------------------------------------------
# One-pass canonical reader


class _Refused(Exception):
    """Internal: the bytes are refused; ``reason`` is one of the fixed decode reasons."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one datum at a position of the buffer: (value, position after it). Raises
:class:`_Refused`, ``IndexError`` (past the end: truncated) or ``UnicodeDecodeError``."""


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint in its canonical form: minimal length, at most 64 bits."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    z, shift = b & 0x7F, 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 70:
            raise _Refused("invalid avro")
    if b == 0:
        raise _Refused("non-canonical encoding")  # a trailing zero group: overlong
    if z >> 64:
        raise _Refused("invalid avro")
    return (z >> 1) ^ -(z & 1), pos


def _read_int(buf: bytes, pos: int) -> tuple[int, int]:
    value, pos = _read_long(buf, pos)
    if not _INT32[0] <= value <= _INT32[1]:
        raise _Refused("invalid avro")
    return value, pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _read_long(buf, pos)
    if n < 0:
        raise _Refused("invalid avro")
    end = pos + n
    if end > len(buf):
        raise _Refused("truncated")
    return buf[pos:end], end


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = _read_long(buf, pos)
    if n < 0:
        raise _Refused("invalid avro")
    end = pos + n
    if end > len(buf):
        raise _Refused("truncated")
    return buf[pos:end].decode("utf-8"), end


def _read_boolean(buf: bytes, pos: int) -> tuple[bool, int]:
    b = buf[pos]
    if b > 1:
        raise _Refused("non-canonical encoding")
    return b == 1, pos + 1


def _read_null(buf: bytes, pos: int) -> tuple[None, int]:
    return None, pos


_PRIMITIVE_READERS: Final[Mapping[str, Reader]] = {
    "null": _read_null, "boolean": _read_boolean, "int": _read_int, "long": _read_long,
    "bytes": _read_bytes, "string": _read_string,
}


def _index(i: int, n: int) -> None:
    """Refuse an enum symbol or union branch index outside ``0..n-1``: a negative one that
    Python would still index is non-canonical (fastavro reads it), anything else invalid."""
    raise _Refused("non-canonical encoding" if -n <= i < 0 else "invalid avro")


def _enum_reader(symbols: tuple[str, ...]) -> Reader:
    n = len(symbols)

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < n:
            _index(i, n)
        return symbols[i], pos

    return read


def _union_reader(branches: tuple[Reader, ...]) -> Reader:
    n = len(branches)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        i, pos = _read_long(buf, pos)
        if not 0 <= i < n:
            if -n <= i < 0:
                branches[i](buf, pos)  # as fastavro would: a defect inside it is reported first
            _index(i, n)
        return branches[i](buf, pos)

    return read


def _array_reader(items: Reader, item_min_bytes: int, bound: tuple[int, str] | None) -> Reader:
    limit, bound_reason = bound if bound is not None else (None, "")

    def read(buf: bytes, pos: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        blocks, sized = 0, False
        while True:
            count, pos = _read_long(buf, pos)
            if count == 0:
                break
            if count < 0:
                count = -count
                _, pos = _read_long(buf, pos)  # the block's byte size
                sized = True
            blocks += 1
            # Checked before any item is read: a hostile count allocates nothing.
            if limit is not None and len(out) + count > limit:
                raise _Refused(bound_reason)
            if item_min_bytes and count * item_min_bytes > len(buf) - pos:
                raise _Refused("truncated")
            for _ in range(count):
                value, pos = items(buf, pos)
                out.append(value)
        if blocks > 1 or sized:
            # fastavro (and the Avro spec's canonical writer) writes one positive block.
            raise _Refused("non-canonical encoding")
        return out, pos

    return read


def _record_reader(fields: tuple[tuple[str, Reader], ...]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for name, reader in fields:
            out[name], pos = reader(buf, pos)
        return out, pos

    return read


class _Unsupported(Exception):
    """Internal: a schema the one-pass reader does not compile (the three-pass path is used)."""


def _min_bytes(schema: Any, named: Mapping[str, Any]) -> int:
    """Fewest bytes one datum of ``schema`` occupies (0 or 1 is all the array check needs)."""
    if isinstance(schema, str):
        return _min_bytes(named[schema], named) if schema in named else int(schema != "null")
    if isinstance(schema, list):
        return 1
    if schema["type"] == "record":
        return int(any(_min_bytes(f["type"], named) for f in schema["fields"]))
    return 1


def _compile(schema: Any, named: Mapping[str, Any], bounds: Mapping[str, tuple[int, str]],
             top: bool = True) -> Reader:
    """The one-pass canonical reader of ``schema``; ``bounds`` apply to top-level array fields."""
    if isinstance(schema, str):
        if schema in named:
            return _compile(named[schema], named, {}, top=False)
        reader = _PRIMITIVE_READERS.get(schema)
        if reader is None:
            raise _Unsupported(schema)
        return reader
    if isinstance(schema, list):
        # Only null + one type: there the writer's "first branch that fits" is always the one
        # read, so reading a valid index is canonical. Other unions need that check: not compiled.
        if len(schema) != 2 or sum(b == "null" for b in schema) != 1:
            raise _Unsupported("union")
        return _union_reader(tuple(_compile(b, named, {}, top=False) for b in schema))
    kind = schema["type"]
    if kind == "record":
        return _record_reader(tuple(
            (f["name"], _array_field(f["type"], named, bounds.get(f["name"])) if top
             else _compile(f["type"], named, {}, top=False))
            for f in schema["fields"]))
    if kind == "enum":
        return _enum_reader(tuple(schema["symbols"]))
    if kind == "array":
        return _array_reader(_compile(schema["items"], named, {}, top=False),
                             _min_bytes(schema["items"], named), None)
    if kind in _PRIMITIVE_READERS:
        return _PRIMITIVE_READERS[kind]
    raise _Unsupported(kind)


def _array_field(schema: Any, named: Mapping[str, Any], bound: tuple[int, str] | None) -> Reader:
    if bound is not None and isinstance(schema, dict) and schema.get("type") == "array":
        return _array_reader(_compile(schema["items"], named, {}, top=False),
                             _min_bytes(schema["items"], named), bound)
    return _compile(schema, named, {}, top=False)


def _reader_for(schema: Any, bounds: tuple[tuple[str, int, str], ...]) -> Reader | None:
    try:
        by_field = {field: (limit, reason) for field, limit, reason in bounds}
        return _compile(schema, schema["__named_schemas"], by_field)
    except _Unsupported:
        return None


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
        self._schema = _parsed_schema(name)
        self._named: Mapping[str, Any] = self._schema["__named_schemas"]
        self._bounds = _ARRAY_BOUNDS.get(name, ())
        self._reader = _reader_for(self._schema, self._bounds)
        self.max_bytes: Final = _SIZE_LIMITS.get(name, MAX_RECORD_BYTES)

    def __repr__(self) -> str:
        return f"AvroCodec({self.name!r})"

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Validate ``record`` against the schema and return its wire bytes.

        Fields with a schema default may be omitted. Raises :class:`DecodeError` with reason
        ``"encode: <field path>: <problem>"`` (never the value itself), or ``"encode: oversize"``
        when the result would exceed :attr:`max_bytes` and so be undecodable.
        """
        body = self._body(record)
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

    def _body(self, record: object) -> bytes | str:
        """Avro body of ``record``, or a payload-free reason why it does not conform."""
        try:
            conformed = _conform(self._schema, record, "", self._named)
        except _Invalid as exc:
            return exc.reason
        for field, limit, reason in self._bounds:
            if len(conformed[field]) > limit:
                return reason
        buf = io.BytesIO()
        try:
            fastavro.schemaless_writer(buf, self._schema, conformed)
        except Exception:  # noqa: BLE001 - conformed data should never fail; refuse, never crash
            return "invalid avro"
        return buf.getvalue()

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
            return "schema mismatch" if buf[1] in _KNOWN_IDS else "unknown schema"
        if self._reader is not None:
            return self._read(buf)
        return self._decode_three_pass(buf)

    def _read(self, buf: bytes) -> dict[str, Any] | str:
        """One pass: decode, bound-check and refuse non-canonical bytes as they are read."""
        assert self._reader is not None
        try:
            record, end = self._reader(buf, 2)
        except _Refused as exc:
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
        """fastavro's reader, then a validating re-encode compared with the input (schemas the
        one-pass reader does not compile)."""
        fields = self._schema["fields"]
        for field, limit, reason in self._bounds:
            if _array_exceeds(buf, 2, fields, field, limit):
                return reason
        fo = io.BytesIO(buf)
        fo.seek(2)
        try:
            record = fastavro.schemaless_reader(fo, self._schema, None)
        except EOFError:
            return "truncated"
        except UnicodeDecodeError:
            return "invalid utf-8"
        # Hostile bytes make fastavro raise IndexError, ValueError, OverflowError, MemoryError,
        # struct errors and more; the contract is that only DecodeError leaves this module.
        except Exception:  # noqa: BLE001
            return "invalid avro"
        if fo.tell() != len(buf):
            return "trailing bytes"
        if not isinstance(record, dict):
            return "invalid avro"
        for field, limit, reason in self._bounds:
            if len(record[field]) > limit:
                return reason
        body = self._body(record)
        if isinstance(body, str):
            return "invalid avro"
        if memoryview(buf)[2:] != body:
            return "non-canonical encoding"
        return record


@functools.cache
def get_codec(name: str) -> AvroCodec:
    """The shared :class:`AvroCodec` for ``name`` (one of :data:`SCHEMA_IDS`)."""
    return AvroCodec(name)
