"""MirrorMaker 2's checkpoint records: a consumer group's position on the source cluster and the
matching (translated) position on the target, as MirrorMaker writes them to
``<source alias>.checkpoints.internal`` on the target.

The layout is Kafka's own protocol types (``org.apache.kafka.connect.mirror.Checkpoint``):

* key: ``group`` STRING, ``topic`` STRING, ``partition`` INT32;
* value: a header ``version`` INT16 (0), then ``upstreamOffset`` INT64, ``offset`` INT64 (the
  translated one), ``metadata`` STRING;

where a STRING is an INT16 length and that many UTF-8 bytes, every integer big-endian. The
writer is here beside the reader for tests (and for rehearsing a failover without MirrorMaker).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from streamsched.errors import DecodeError

VERSION = 0
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAX_STRING = 32767


@dataclass(frozen=True)
class Checkpoint:
    """Group ``group`` had consumed ``topic``/``partition`` up to ``upstream`` on the source; on
    the target that position is ``downstream`` (never past the true one, possibly short of it)."""

    group: str
    topic: str
    partition: int
    upstream: int
    downstream: int
    metadata: str = ""

    def encode_key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + _I32.pack(self.partition)

    def encode_value(self) -> bytes:
        return (_I16.pack(VERSION) + _I64.pack(self.upstream) + _I64.pack(self.downstream)
                + _string(self.metadata))


def decode_checkpoint(key: bytes | None, value: bytes | None) -> Checkpoint:
    """The checkpoint of one record of the checkpoints topic; :class:`DecodeError` if it is not one."""
    if key is None or value is None:
        raise DecodeError("mirror checkpoint without a key or value")
    group, at = _read_string(key, 0)
    topic, at = _read_string(key, at)
    (partition,) = _unpack(_I32, key, at)
    if at + _I32.size != len(key):
        raise DecodeError("mirror checkpoint key has trailing bytes")
    (version,) = _unpack(_I16, value, 0)
    if version != VERSION:
        raise DecodeError(f"mirror checkpoint version {version} is not known (expected {VERSION})")
    (upstream,) = _unpack(_I64, value, 2)
    (downstream,) = _unpack(_I64, value, 10)
    metadata, end = _read_string(value, 18)
    if end != len(value):
        raise DecodeError("mirror checkpoint value has trailing bytes")
    if partition < 0 or upstream < 0 or downstream < 0:
        raise DecodeError("mirror checkpoint with a negative partition or offset")
    return Checkpoint(group, topic, partition, upstream, downstream, metadata)


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > _MAX_STRING:
        raise DecodeError("mirror checkpoint string longer than 32767 bytes")
    return _I16.pack(len(raw)) + raw


def _unpack(fmt: struct.Struct, data: bytes, at: int) -> tuple[int, ...]:
    if at + fmt.size > len(data):
        raise DecodeError("mirror checkpoint is truncated")
    return fmt.unpack_from(data, at)


def _read_string(data: bytes, at: int) -> tuple[str, int]:
    (size,) = _unpack(_I16, data, at)
    start = at + _I16.size
    if size < 0 or start + size > len(data):
        raise DecodeError("mirror checkpoint string is truncated")
    try:
        return data[start:start + size].decode(), start + size
    except UnicodeDecodeError as exc:
        raise DecodeError("mirror checkpoint string is not UTF-8") from exc
