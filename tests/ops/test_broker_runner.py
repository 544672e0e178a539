"""The local broker runner makes cluster ids as Kafka does, so `broker start` never fails on one."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

from streamsched.ops.broker import _cluster_id

_ALPHABET = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_cluster_ids_never_start_with_a_dash() -> None:
    # About 1 in 64 random UUIDs encode with a leading '-', which kafka-storage reads as an
    # option; 20,000 draws would hit ~300 of them without the redraw.
    ids = [_cluster_id() for _ in range(20_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert len(text) == 22 and set(text) <= _ALPHABET
        raw = base64.urlsafe_b64decode(text + "==")
        assert len(raw) == 16
        assert raw[6] >> 4 == 4 and raw[8] & 0xC0 == 0x80  # version 4, RFC 4122 variant
        assert raw not in (bytes(16), bytes(15) + b"\x01")
    # Dashes elsewhere are valid base64url and must stay possible (no skewed alphabet).
    assert any("-" in i for i in ids)


def test_a_leading_dash_or_reserved_id_is_drawn_again() -> None:
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url '-' is 62: top six bits 111110
    zero = uuid.UUID(int=0)
    good = uuid.UUID("12345678-1234-4234-8234-123456789abc")
    assert base64.urlsafe_b64encode(dash.bytes).startswith(b"-")
    draws: Iterator[uuid.UUID] = iter([dash, zero, good])
    drawn: list[uuid.UUID] = []

    def fake() -> uuid.UUID:
        drawn.append(next(draws))
        return drawn[-1]

    assert _cluster_id(fake) == base64.urlsafe_b64encode(good.bytes).decode().rstrip("=")
    assert drawn == [dash, zero, good]
