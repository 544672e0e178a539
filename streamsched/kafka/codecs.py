"""Compressed record batches: which codecs this process can read, and naming a batch it cannot.

Kafka producers compress whole record batches (``compression.type`` gzip, snappy, lz4 or zstd);
the consumer must decompress them. aiokafka decodes gzip with the standard library and the other
three with ``cramjam``, which streamsched installs (``aiokafka[lz4,snappy,zstd]``). Without it, or
for a codec id aiokafka does not know, or for a batch that fails its CRC or does not decompress,
aiokafka raises *from* ``getmany`` while draining the fetched records, with nothing in the
exception that says which partition the batch came from (measured with aiokafka 0.14: a worker's
intake died on every restart, 0 of 20 lz4/snappy/zstd events handled).

:func:`failed_partition` recovers the partition from the traceback (the frames of aiokafka's
``FetchResult``/``PartitionRecords``, the only code that decodes fetched batches), and
:class:`UndecodableBatch` is the one-line error the worker reports for that partition while the
others go on (see :mod:`streamsched.worker.intake`).
"""

from __future__ import annotations

import re
from typing import Final

from streamsched.errors import StreamschedError
from streamsched.kafka import compat
from streamsched.kafka.protocols import TopicPartitionLike

__all__ = ["CODECS", "UndecodableBatch", "available", "failed_partition", "missing_codec"]

CODECS: Final = ("gzip", "snappy", "lz4", "zstd")
"""Kafka's compression codecs (record batch attribute bits 0-2 = 1..4)."""

_MISSING: Final = re.compile(r"Libraries for (gzip|snappy|lz4|zstd) compression codec not found")
_UNKNOWN: Final = re.compile(r"Unknown compression codec (0x[0-9a-fA-F]+)")


def available() -> dict[str, bool]:
    """Codec name -> whether this process can decompress it (aiokafka's own checks)."""
    from aiokafka import codec

    return {"gzip": bool(codec.has_gzip()), "snappy": bool(codec.has_snappy()),
            "lz4": bool(codec.has_lz4()), "zstd": bool(codec.has_zstd())}


def missing_codec(exc: BaseException) -> str | None:
    """The codec ``exc`` (aiokafka's ``UnsupportedCodecError``) says is missing: ``"lz4"``...,
    ``"unknown"`` for a codec id aiokafka does not know, else None."""
    text = str(exc)
    found = _MISSING.search(text)
    if found:
        return found.group(1)
    return "unknown" if _UNKNOWN.search(text) else None


def failed_partition(exc: BaseException) -> TopicPartitionLike | None:
    """The ``TopicPartition`` whose fetched batch raised ``exc`` inside aiokafka's record
    decoding, or None when ``exc`` did not come from decoding one partition's batch (a fetch
    error, a stopped consumer, our own bug: not a batch problem, left to the caller).

    aiokafka's errors do not carry the partition; :func:`streamsched.kafka.compat.failed_partition`
    finds it in the traceback's decoding frames."""
    return compat.failed_partition(exc)


class UndecodableBatch(StreamschedError):
    """A partition stopped at a record batch this process cannot decode.

    ``reason`` is the codec whose support is missing (``gzip``/``snappy``/``lz4``/``zstd``),
    ``unknown_codec``, ``corrupt`` (CRC mismatch) or ``undecodable`` (the batch did not
    decompress); ``kind`` is ``missing_codec``, ``unknown_codec``, ``corrupt_batch`` or
    ``undecodable_batch``. The latest error in ``/status`` is kept as type and kind only (and a
    kind has no digits there), so the worker also exports the reason as the ``reason`` label of
    ``partition_stopped``. The message names topic, partition and offset (operator-chosen names
    and numbers), never record contents.
    """

    kind = "undecodable_batch"

    def __init__(self, topic: str, partition: int, offset: int | None, cause: BaseException) -> None:
        codec = missing_codec(cause)
        cause_name = type(cause).__name__
        if codec in CODECS:
            reason = codec
            what = (f"its record batch is {codec}-compressed and this process has no {codec} support "
                    f"(install aiokafka[{codec}], i.e. cramjam, and restart)")
            self.kind = "missing_codec"
        elif codec == "unknown":
            reason = "unknown_codec"
            what = "its record batch uses a compression codec aiokafka does not know"
            self.kind = "unknown_codec"
        elif cause_name == "CorruptRecordException":
            reason = "corrupt"
            what = "its record batch fails its CRC check"
            self.kind = "corrupt_batch"
        else:
            reason = "undecodable"
            what = f"its record batch could not be decoded ({cause_name})"
        at = f"offset {offset}" if offset is not None else "its current offset"
        super().__init__(f"partition {topic}[{partition}] stopped at {at}: {what}; "
                         "other partitions go on")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        self.codec = codec if codec in CODECS else None
