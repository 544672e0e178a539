"""Large hypothesis fuzz runs over every decoder (``-m fuzz``; about half a minute; set
``STREAMSCHED_FUZZ_EXAMPLES`` above its 4,000 for a deeper run).

Contract under test: for any input, every decoder either returns or raises ``DecodeError``
(never another exception, never a chained exception carrying the input), within a bounded
time even for inputs at the maximum record size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from avro_strategies import avro_values, zigzag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.model.jsonval import json_loads
from streamsched.model.limits import MAX_RECORD_BYTES
from streamsched.wire.avro import MAGIC, SCHEMA_IDS, get_codec
from streamsched.wire.transition import decode_transition

pytestmark = pytest.mark.fuzz

NAMES = sorted(SCHEMA_IDS, key=SCHEMA_IDS.__getitem__)

FUZZ = settings(
    max_examples=int(os.environ.get("STREAMSCHED_FUZZ_EXAMPLES", "4000")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DECODERS: list[tuple[str, Callable[[Any], object]]] = [
    *((name, get_codec(name).decode) for name in NAMES),
    ("decode_transition", decode_transition),
    ("json_loads", json_loads),
]



def _valid(name: str) -> st.SearchStrategy[bytes]:
    payloads = st.sampled_from([b"", b"{}", b"[1,2]", b'{"a":"b"}', b"\xff"]) | st.binary(max_size=16)
    return avro_values(name, text=st.text(max_size=16), binary=payloads).map(get_codec(name).encode)


valid_encodings = st.one_of([_valid(n) for n in NAMES])


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_encodings))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF]))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=12))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 12))]
        elif op == "splice":
            data[pos:pos] = zigzag(draw(st.sampled_from([-1, -(2**31), 2**31, 2**62, -(2**63)])))
        else:
            del data[pos:]
    return bytes(data)


@st.composite
def hostile_lengths(draw: st.DrawFn) -> bytes:
    """A valid envelope, a few fields, then a huge length/count prefix and up to a full record."""
    sid = draw(st.sampled_from(sorted(SCHEMA_IDS.values())))
    fields = b"".join(draw(st.lists(st.sampled_from([b"\x00", b"\x02e", b"\x02", b"\x01"]), max_size=6)))
    prefix = zigzag(draw(st.sampled_from([2**20, 2**31, 2**62, 2**63 - 1, -(2**40), -1])))
    filler = draw(st.sampled_from([b"\x00", b"\x02", b"\x02\x00", b"\x01\x02\x00", b"\xff"]))
    size = draw(st.integers(0, MAX_RECORD_BYTES))
    head = bytes((MAGIC, sid)) + fields + prefix
    return head + (filler * (size // len(filler) + 1))[: max(size - len(head), 0)]


enveloped = st.builds(
    lambda sid, body: bytes((MAGIC, sid)) + body, st.integers(0, 255), st.binary(max_size=256)
)

inputs = st.one_of(
    st.binary(max_size=2048),
    enveloped,
    mutated(),
    hostile_lengths(),
)

json_like = st.lists(
    st.sampled_from(
        [
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b'"',
            b"\\",
            b"\\u",
            b"d800",
            b"1",
            b"-",
            b"e9",
            b".",
            b"true",
            b"null",
            b"NaN",
            b" ",
            b'"k"',
            b"\xff",
            b"\xc3",
            b"\x00",
            b"1e999",
            b"18446744073709551616",
        ]
    ),
    max_size=128,
).map(b"".join)


def _check(data: Any) -> None:
    for name, decode in DECODERS:
        try:
            decode(data)
        except DecodeError as err:
            assert err.__context__ is None, name
        except Exception as exc:  # pragma: no cover - the failure path
            raise AssertionError(f"{name} raised {type(exc).__name__}") from exc


@given(data=inputs)
@FUZZ
def test_fuzz_every_decoder_only_raises_decode_error(data: bytes) -> None:
    _check(data)


@given(data=json_like | json_like.map(lambda b: b.decode("utf-8", "replace")))
@FUZZ
def test_fuzz_json_loads_only_raises_decode_error(data: bytes | str) -> None:
    try:
        json_loads(data)
    except DecodeError as err:
        assert err.__context__ is None
