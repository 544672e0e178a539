"""Record conformance of :mod:`streamsched.wire.avro`: checking a record against its schema with
payload-free reasons, and the validated Avro body built from the conformed record.

Shared by :meth:`AvroCodec.encode <streamsched.wire.avro.AvroCodec.encode>` and by the three-pass
decode path's canonical check (:mod:`streamsched.wire.avro_fallback`), which re-encodes a decoded
record through :func:`validated_body` and compares the bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import fastavro

from streamsched.wire.avro_schema import INT32, INT64

__all__ = ["Invalid", "conform", "validated_body"]


class Invalid(Exception):
    """Internal: a datum does not fit the schema; ``reason`` is already payload-free."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def validated_body(schema: dict[str, Any], named: Mapping[str, Any],
                   bounds: tuple[tuple[str, int, str], ...], record: object) -> bytes | str:
    """Avro body of ``record``, or a payload-free reason why it does not conform.

    ``bounds`` are the codec's (top-level array field, max items, reason) triples.
    """
    try:
        conformed = conform(schema, record, "", named)
    except Invalid as exc:
        return exc.reason
    for field, limit, reason in bounds:
        if len(conformed[field]) > limit:
            return reason
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, schema, conformed)
    except Exception:  # noqa: BLE001 - conformed data should never fail; refuse, never crash
        return "invalid avro"
    return buf.getvalue()


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def conform(schema: Any, datum: Any, path: str, named: Mapping[str, Any]) -> Any:
    """Return ``datum`` in the exact shape fastavro writes, or raise :class:`Invalid`.

    fastavro's own validation misses unknown record keys, coerces some types and its error
    messages embed the datum, so the checks are done here with reasons that name only
    schema fields and positions.
    """
    where = path or "record"
    if isinstance(schema, str):
        if schema in named:
            return conform(named[schema], datum, path, named)
        return _conform_primitive(schema, datum, where)
    if isinstance(schema, list):
        if datum is None and "null" in schema:
            return None
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            # The common ["null", X] case: X's own reason is more useful than "no branch".
            return conform(branches[0], datum, path, named)
        for branch in branches:
            try:
                return conform(branch, datum, path, named)
            except Invalid:
                continue
        raise Invalid(f"{where}: matches no union branch")
    kind = schema["type"]
    if kind == "record":
        if not isinstance(datum, Mapping):
            raise Invalid(f"{where}: expected a record")
        fields = schema["fields"]
        names = {f["name"] for f in fields}
        # Unknown keys are reported without their name: keys can come from caller data.
        if any(key not in names for key in datum):
            raise Invalid(f"{where}: unknown field")
        out: dict[str, Any] = {}
        for f in fields:
            fname = f["name"]
            if fname in datum:
                value = datum[fname]
            elif "default" in f:
                value = f["default"]
            else:
                raise Invalid(f"{_join(path, fname)}: missing")
            out[fname] = conform(f["type"], value, _join(path, fname), named)
        return out
    if kind == "enum":
        if not isinstance(datum, str) or datum not in schema["symbols"]:
            raise Invalid(f"{where}: not a symbol of {schema['name'].rsplit('.', 1)[-1]}")
        return datum
    if kind == "array":
        if isinstance(datum, str | bytes | bytearray | Mapping) or not isinstance(datum, Sequence):
            raise Invalid(f"{where}: expected an array")
        return [conform(schema["items"], item, f"{where}[{i}]", named) for i, item in enumerate(datum)]
    if kind == "map":
        if not isinstance(datum, Mapping):
            raise Invalid(f"{where}: expected a map")
        if not all(isinstance(k, str) for k in datum):
            raise Invalid(f"{where}: map keys must be strings")
        return {k: conform(schema["values"], v, f"{where}[]", named) for k, v in datum.items()}
    if kind == "fixed":
        if not isinstance(datum, bytes | bytearray) or len(datum) != schema["size"]:
            raise Invalid(f"{where}: expected {schema['size']} bytes")
        return bytes(datum)
    return _conform_primitive(kind, datum, where)


def _conform_primitive(kind: str, datum: Any, where: str) -> Any:
    if kind == "null":
        if datum is not None:
            raise Invalid(f"{where}: expected null")
        return None
    if kind == "boolean":
        if not isinstance(datum, bool):
            raise Invalid(f"{where}: expected boolean")
        return datum
    if kind in ("int", "long"):
        low, high = INT32 if kind == "int" else INT64
        if isinstance(datum, bool) or not isinstance(datum, int):
            raise Invalid(f"{where}: expected {kind}")
        if not low <= datum <= high:
            raise Invalid(f"{where}: {kind} out of range")
        return datum
    if kind in ("float", "double"):
        if isinstance(datum, bool) or not isinstance(datum, int | float):
            raise Invalid(f"{where}: expected {kind}")
        return float(datum)
    if kind == "bytes":
        if not isinstance(datum, bytes | bytearray | memoryview):
            raise Invalid(f"{where}: expected bytes")
        return bytes(datum)
    if kind == "string":
        if not isinstance(datum, str):
            raise Invalid(f"{where}: expected string")
        if not datum.isascii():
            try:
                datum.encode("utf-8")
            except UnicodeEncodeError:
                raise Invalid(f"{where}: not encodable as UTF-8") from None
        return datum
    raise Invalid(f"{where}: unsupported schema type")
