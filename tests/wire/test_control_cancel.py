"""The cancel control record and the audit entry's action (streamsched/wire/control.py): a cancel
is a re-drive's request document under another control header, and the re-drive's record is
byte for byte what it was before cancel existed."""

from __future__ import annotations

import pytest

from streamsched.errors import DecodeError
from streamsched.model.jsonval import json_dumps
from streamsched.wire.control import (
    CANCEL,
    CONTROL_HEADER,
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

IDENTITY = "sched_" + "cd" * 32


def test_a_cancel_round_trips_through_its_headers_and_is_due_now() -> None:
    req = RedriveRequest.new(IDENTITY, 3, principal="User:ops", at_ns=9, reason="closed\taccount",
                             action="cancel")
    headers = redrive_headers(req)
    assert control_kind(headers) == CANCEL and due_ns(headers) == 0
    assert decode_request(headers) == req and req.action == "cancel" and req.reason == "closed?account"
    assert redrive_record(req, None, None) == (IDENTITY.encode(), None, headers)
    with pytest.raises(ValueError):
        redrive_record(req, b"event", b"route")  # a cancel never runs an event
    with pytest.raises(ValueError):
        RedriveRequest.new(IDENTITY, 3, principal="p", at_ns=0, action="cancel", force=True)
    with pytest.raises(ValueError):
        RedriveRequest.new(IDENTITY, 3, principal="p", at_ns=0, action="delete")


def test_the_redrive_record_is_unchanged() -> None:
    req = RedriveRequest(IDENTITY, 7, "User:ops", 123, "fixed", True, "ab" * 16)
    assert req.action == "redrive"
    assert req.encode() == json_dumps({"v": 1, "identity": IDENTITY, "revision": 7, "principal": "User:ops",
                                       "at_ns": 123, "reason": "fixed", "force": True, "request": "ab" * 16})
    assert redrive_headers(req) == [(CONTROL_HEADER, REDRIVE), (REQUEST_HEADER, req.encode()),
                                    ("ss-due-ns", b"0")]
    assert decode_request(redrive_headers(req)) == req


def test_a_forced_cancel_or_an_unknown_kind_is_a_decode_error() -> None:
    forced = RedriveRequest(IDENTITY, 1, "p", 1, "", True, "r").encode()
    with pytest.raises(DecodeError, match="forced cancel"):
        decode_request([(CONTROL_HEADER, CANCEL), (REQUEST_HEADER, forced)])
    with pytest.raises(DecodeError, match="unknown kind"):
        decode_request([(CONTROL_HEADER, b"reboot"), (REQUEST_HEADER, forced)])


def test_audit_entries_say_their_action_and_older_ones_read_as_redrives() -> None:
    entry = AuditEntry(IDENTITY, "r1", "User:ops", 1, 2, "why", "cancelled", "", "", 3, 4, "cancel")
    assert AuditEntry.decode(entry.encode()) == entry and entry.to_dict()["action"] == "cancel"
    redrive = AuditEntry(IDENTITY, "r1", "User:ops", 1, 2, "why", "reopened", "", "FAILED", 3, 4)
    assert b'"action":"redrive"' in redrive.encode()  # as entries were always written
    doc = {"v": 1, "identity": IDENTITY, "request": "r1", "principal": "p", "requested_ns": 1,
           "applied_ns": 2, "reason": "", "result": "reopened", "why": "", "outcome_before": "FAILED",
           "fence": 3, "revision": 4}
    assert AuditEntry.decode(json_dumps(doc)).action == "redrive"
