"""The one-pass canonical reader of :mod:`streamsched.wire.avro`: a schema compiled once into a
small reader per field that decodes, bound-checks and refuses non-canonical bytes as it reads them.

A decoded record must be *canonical*: it re-encodes to exactly the input bytes, so negative
enum/union indices, out-of-range ints, overlong varints, non-0/1 booleans and arrays in several or
size-prefixed blocks (all of which fastavro accepts silently) are refused. Checking that in the
decoder's own pass replaced fastavro's reader + a validating re-encode + a byte comparison, three
passes that cost more than the rest of the worker's turn (py-spy).

This is the worker's hot path: each field costs one call of its reader and nothing else (no
per-record or per-field indirection may be added here). A schema using a type the compiler does
not know (float, double, map, fixed, a union other than ``null`` + one type) is not compiled
(:func:`reader_for` returns ``None``) and the codec keeps the three-pass path of
:mod:`streamsched.wire.avro_fallback`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from streamsched.wire.avro_schema import INT32

__all__ = ["Reader", "Refused", "reader_for"]


class Refused(Exception):
    """Internal: the bytes are refused; ``reason`` is one of the fixed decode reasons."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one datum at a position of the buffer: (value, position after it). Raises
:class:`Refused`, ``IndexError`` (past the end: truncated) or ``UnicodeDecodeError``."""


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
            raise Refused("invalid avro")
    if b == 0:
        raise Refused("non-canonical encoding")  # a trailing zero group: overlong
    if z >> 64:
        raise Refused("invalid avro")
    return (z >> 1) ^ -(z & 1), pos


def _read_int(buf: bytes, pos: int) -> tuple[int, int]:
    value, pos = _read_long(buf, pos)
    if not INT32[0] <= value <= INT32[1]:
        raise Refused("invalid avro")
    return value, pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _read_long(buf, pos)
    if n < 0:
        raise Refused("invalid avro")
    end = pos + n
    if end > len(buf):
        raise Refused("truncated")
    return buf[pos:end], end


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = _read_long(buf, pos)
    if n < 0:
        raise Refused("invalid avro")
    end = pos + n
    if end > len(buf):
        raise Refused("truncated")
    return buf[pos:end].decode("utf-8"), end


def _read_boolean(buf: bytes, pos: int) -> tuple[bool, int]:
    b = buf[pos]
    if b > 1:
        raise Refused("non-canonical encoding")
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
    raise Refused("non-canonical encoding" if -n <= i < 0 else "invalid avro")


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
                raise Refused(bound_reason)
            if item_min_bytes and count * item_min_bytes > len(buf) - pos:
                raise Refused("truncated")
            for _ in range(count):
                value, pos = items(buf, pos)
                out.append(value)
        if blocks > 1 or sized:
            # fastavro (and the Avro spec's canonical writer) writes one positive block.
            raise Refused("non-canonical encoding")
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


def reader_for(schema: Any, bounds: tuple[tuple[str, int, str], ...]) -> Reader | None:
    """The compiled reader of a parsed top-level ``schema`` enforcing the codec's array
    ``bounds``, or ``None`` if the schema uses a type the compiler does not know."""
    try:
        by_field = {field: (limit, reason) for field, limit, reason in bounds}
        return _compile(schema, schema["__named_schemas"], by_field)
    except _Unsupported:
        return None
