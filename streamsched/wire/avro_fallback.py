"""The three-pass decode path of :mod:`streamsched.wire.avro`, kept for schemas the one-pass
reader (:mod:`streamsched.wire.avro_reader`) does not compile, so the codec stays total for any
schema: fastavro's reader, then a validating re-encode compared byte for byte with the input.

No shipped schema takes this path today; the one-pass reader's tests compare the two paths on the
same bytes, so this is also the reference the fast reader is held to.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Final

import fastavro

from streamsched.wire.avro_conform import validated_body

__all__ = ["array_exceeds", "decode_three_pass"]

_SKIPPABLE: Final = frozenset({"string", "bytes", "int", "long"})


def decode_three_pass(buf: bytes, schema: dict[str, Any], named: Mapping[str, Any],
                      bounds: tuple[tuple[str, int, str], ...]) -> dict[str, Any] | str:
    """The record encoded in ``buf`` after its two-byte envelope, or a payload-free refusal
    reason (the same reasons as the one-pass reader's)."""
    fields = schema["fields"]
    for field, limit, reason in bounds:
        if array_exceeds(buf, 2, fields, field, limit):
            return reason
    fo = io.BytesIO(buf)
    fo.seek(2)
    try:
        record = fastavro.schemaless_reader(fo, schema, None)
    except EOFError:
        return "truncated"
    except UnicodeDecodeError:
        return "invalid utf-8"
    # Hostile bytes make fastavro raise IndexError, ValueError, OverflowError, MemoryError,
    # struct errors and more; the contract is that only DecodeError leaves the codec.
    except Exception:  # noqa: BLE001
        return "invalid avro"
    if fo.tell() != len(buf):
        return "trailing bytes"
    if not isinstance(record, dict):
        return "invalid avro"
    for field, limit, reason in bounds:
        if len(record[field]) > limit:
            return reason
    body = validated_body(schema, named, bounds, record)
    if isinstance(body, str):
        return "invalid avro"
    if memoryview(buf)[2:] != body:
        return "non-canonical encoding"
    return record


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


def array_exceeds(buf: bytes, pos: int, fields: list[dict[str, Any]], name: str, limit: int) -> bool:
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
