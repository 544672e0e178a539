"""The re-drive control record and its audit entry (streamsched/wire/control.py): round trips, and
decoders that raise nothing but DecodeError on any input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.wire.control import (
    CONTROL_HEADER,
    MAX_REASON,
    REDRIVE,
    REQUEST_HEADER,
    AuditEntry,
    RedriveRequest,
    control_kind,
    decode_request,
    redrive_headers,
    redrive_record,
)
from streamsched.wire.delay import due_ns

IDENTITY = "sched_" + "ab" * 32


def test_a_request_round_trips_through_its_headers_and_is_due_now() -> None:
    req = RedriveRequest.new(IDENTITY, 7, principal="User:ops", at_ns=123, reason="bug\n42 fixed", force=True)
    headers = redrive_headers(req)
    assert control_kind(headers) == REDRIVE and due_ns(headers) == 0
    assert decode_request(headers) == req
    assert req.reason == "bug?42 fixed"  # control characters never reach logs or the audit trail
    assert control_kind([("other", b"x")]) is None


def test_the_reason_and_principal_are_bounded() -> None:
    req = RedriveRequest.new(IDENTITY, 1, principal="p" * 500, at_ns=0, reason="r" * 500)
    assert len(req.reason) == MAX_REASON and len(req.principal) == 200


def test_a_record_carries_the_event_with_its_route_key_or_only_the_identity() -> None:
    req = RedriveRequest.new(IDENTITY, 1, principal="p", at_ns=0)
    assert redrive_record(req, b"event", b"route")[:2] == (b"route", b"event")
    assert redrive_record(req, None, None)[:2] == (IDENTITY.encode(), None)
    with pytest.raises(ValueError):
        redrive_record(req, b"event", None)


_ID = b'{"v":1,"identity":"' + IDENTITY.encode() + b'",'


@pytest.mark.parametrize("raw", [None, b"", b"{", b"[]", b'{"v":2}',
                                 b'{"v":1,"identity":"x","revision":1,"at_ns":1}',
                                 _ID + b'"revision":-1,"at_ns":1}', _ID + b'"revision":true,"at_ns":1}',
                                 _ID + b'"revision":1,"at_ns":1,"force":1}', b"x" * 5000])
def test_a_malformed_request_is_a_decode_error(raw: bytes | None) -> None:
    headers = [(CONTROL_HEADER, REDRIVE)] + ([(REQUEST_HEADER, raw)] if raw is not None else [])
    with pytest.raises(DecodeError):
        decode_request(headers)


@given(st.binary(max_size=300))
def test_decoding_any_bytes_raises_only_decode_error(raw: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_request([(REQUEST_HEADER, raw)])
    with contextlib.suppress(DecodeError):
        AuditEntry.decode(raw)


def test_an_audit_entry_round_trips() -> None:
    entry = AuditEntry(IDENTITY, "r1", "User:ops", 1, 2, "why", "refused", "live_claim", "FAILED", 3, 4)
    assert AuditEntry.decode(entry.encode()) == entry
    assert entry.to_dict()["why"] == "live_claim"
