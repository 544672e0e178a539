"""Canonical, bounded JSON values (payloads of transition events and schedule definitions).

:func:`json_dumps` writes sorted keys, so equal documents have equal bytes. :func:`json_loads`
raises nothing but :class:`~streamsched.errors.DecodeError` and bounds size and depth.
Pure: no I/O, no Kafka.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from streamsched.errors import DecodeError
from streamsched.model.limits import MAX_JSON_DEPTH, MAX_PAYLOAD_BYTES

Buffer = bytes | bytearray | memoryview
"""What the decoders accept (Kafka clients hand out ``bytes``)."""


def as_bytes(data: object, limit: int) -> bytes | str:
    """``data`` as ``bytes`` within ``limit``, or a failure reason."""
    if isinstance(data, bytes | bytearray):
        size = len(data)
    elif isinstance(data, memoryview):
        size = data.nbytes
    else:
        return "not bytes"
    if size > limit:
        return "oversize"
    return data if isinstance(data, bytes) else bytes(data)




class Bad(NamedTuple):
    reason: str


def json_dumps(obj: object) -> bytes:
    """Canonical JSON bytes of ``obj`` (UTF-8, sorted keys, no whitespace).

    Raises :class:`DecodeError` ``"encode: not JSON-serializable"`` for values orjson cannot
    represent (non-str keys, unsupported types, integers beyond 64 bits, excessive nesting).
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    # Raised outside the handler: the orjson error message can quote the offending value.
    raise DecodeError("encode: not JSON-serializable")


def json_parse(data: object) -> object:
    """The parsed document, or a :class:`Bad` with a payload-free reason."""
    if isinstance(data, str):
        if len(data) > MAX_PAYLOAD_BYTES:
            return Bad("bound: json size")
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            return Bad("invalid json")
    buf = as_bytes(data, MAX_PAYLOAD_BYTES)
    if isinstance(buf, str):
        return Bad("bound: json size" if buf == "oversize" else buf)
    try:
        obj = orjson.loads(buf)
    except orjson.JSONDecodeError:
        # The exception keeps the whole document in ``.doc``; drop it here.
        return Bad("invalid json")
    # Every nested container opens with a bracket, so a document with at most MAX_JSON_DEPTH
    # of them (two C-speed counts) cannot be too deep; only the rest is walked. The walk was
    # about 4 % of a Kafka-native worker's CPU (py-spy) for one-level payloads.
    if (isinstance(obj, dict | list) and buf.count(b"{") + buf.count(b"[") > MAX_JSON_DEPTH
            and _json_depth_exceeds(obj, MAX_JSON_DEPTH)):
        return Bad("bound: json depth")
    return obj


def _json_depth_exceeds(root: dict[str, Any] | list[Any], limit: int) -> bool:
    # Level by level rather than recursively, so a deep document cannot exhaust the Python
    # stack; orjson only produces exact dicts and lists, so class identity suffices.
    level: list[Any] = [root]
    for _ in range(limit):
        deeper: list[Any] = []
        for node in level:
            children = node.values() if node.__class__ is dict else node
            deeper.extend([c for c in children if c.__class__ is dict or c.__class__ is list])
        if not deeper:
            return False
        level = deeper
    return True


def json_loads(data: Buffer | str) -> object:
    """Parse a JSON document; raises only :class:`DecodeError`.

    Bounds: at most ``MAX_PAYLOAD_BYTES`` of UTF-8 and ``MAX_JSON_DEPTH`` nested containers.
    Reasons: ``"not bytes"``, ``"bound: json size"``, ``"bound: json depth"``, ``"invalid json"``.
    """
    result = json_parse(data)
    if isinstance(result, Bad):
        raise DecodeError(result.reason)
    return result
