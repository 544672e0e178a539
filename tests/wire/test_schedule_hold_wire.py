"""What pausing a schedule and its overlap policy add to the catalog's records: the pause and
resume requests, the definition's overlap header and the state's tracking header, and the
enum symbols appended to the state and history records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.model.instants import MAX_BOUNDARY_NS, MIN_BOUNDARY_NS
from streamsched.model.overlap import IDLE, Running
from streamsched.model.schedule import Definition, HistoryRow, Request, ScheduleStatus, State
from streamsched.wire.avro_schema import parsed_schema
from streamsched.wire.schedule import (
    DEFINITION_CODEC,
    HISTORY_CODEC,
    OVERLAP_HEADER,
    RUNNING_HEADER,
    STATE_CODEC,
    decode_definition,
    decode_request,
    decode_running,
    definition_headers,
    encode_request,
    encode_running,
    request_key,
    state_headers,
)

RID = "a" * 32


def test_pause_and_resume_requests_round_trip_and_only_a_pause_has_a_reason() -> None:
    pause = Request("pause", "job", 3, 10**18, RID, reason="db maintenance")
    resume = Request("resume", "job", 3, 10**18, RID)
    key = request_key("job", RID)
    assert decode_request(key, encode_request(pause)) == pause
    assert decode_request(key, encode_request(resume)) == resume
    assert "reason" not in json.loads(encode_request(resume))
    doc = json.loads(encode_request(resume)) | {"reason": "x"}
    with pytest.raises(DecodeError, match="request: fields"):
        decode_request(key, json.dumps(doc).encode())
    long = json.loads(encode_request(pause)) | {"reason": "x" * 201}
    with pytest.raises(DecodeError, match="request: reason"):
        decode_request(key, json.dumps(long, sort_keys=True).encode())
    windowed = json.loads(encode_request(pause)) | {"max": 3}
    with pytest.raises(DecodeError, match="request: a pause has no window"):
        decode_request(key, json.dumps(windowed).encode())


def test_a_definitions_overlap_is_a_header_and_its_absence_means_allow() -> None:
    defn = Definition(name="job", spec="@every 1m", target_topic="t", payload=b"{}", version=1, enabled=True,
                      policy="catch_up", created_ns=1, overlap="buffer_one")
    value = DEFINITION_CODEC.encode(defn.to_record())
    headers = definition_headers(defn)
    assert headers == [(OVERLAP_HEADER, b"buffer_one")]
    assert decode_definition(value, headers) == defn
    assert decode_definition(value, None).overlap == "allow"  # written before overlap existed
    assert definition_headers(Definition.from_record(DEFINITION_CODEC.decode(value))) is None
    with pytest.raises(DecodeError, match="definition: overlap"):
        decode_definition(value, [(OVERLAP_HEADER, b"queue")])


@given(pending=st.none() | st.integers(MIN_BOUNDARY_NS, MAX_BOUNDARY_NS),
       buffered=st.none() | st.integers(MIN_BOUNDARY_NS, MAX_BOUNDARY_NS), skips=st.integers(0, 2**63 - 1))
def test_the_running_header_round_trips(pending: int | None, buffered: int | None, skips: int) -> None:
    running = Running(pending, buffered, skips)
    assert decode_running(encode_running(running)) == running


@pytest.mark.parametrize("doc", [b"[]", b'{"pending": null, "buffered": null}',
                                 b'{"buffered": null, "pending": "1", "skips": 0}',
                                 b'{"buffered": null, "pending": null, "skips": -1}', b"{"])
def test_a_bad_running_header_is_a_decode_error(doc: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_running(doc)


def test_an_idle_state_carries_no_running_header() -> None:
    assert [k for k, _ in state_headers(1)] == ["ss-version"]
    assert [k for k, _ in state_headers(1, (), Running(pending_ns=5))] == ["ss-version", RUNNING_HEADER]
    assert [k for k, _ in state_headers(1, (), IDLE)] == ["ss-version"]


def test_the_appended_enum_symbols_encode_and_the_old_ones_keep_their_bytes() -> None:
    st_ = State("job", "job.v1", 1, ScheduleStatus.PAUSED, 5, 6)
    decoded = State.from_record(STATE_CODEC.decode(STATE_CODEC.encode(st_.to_record())))
    assert decoded.status is ScheduleStatus.PAUSED
    row = HistoryRow("job.v1", "job.v1/5", 5, 0, "SKIPPED", 7, "overlap", "overlap")
    assert HistoryRow.from_record(HISTORY_CODEC.decode(HISTORY_CODEC.encode(row.to_record()))) == row
    # Records written before the symbols existed keep their enum indexes: appended, never inserted.
    assert _symbols("schedule_state", "status") == ["ACTIVE", "DISABLED", "COMPLETED", "FAILED", "PAUSED"]
    assert _symbols("history", "state") == ["RUNNING", "SUCCEEDED", "FAILED", "SKIPPED"]


def _symbols(codec: str, field: str) -> list[str]:
    [f] = [f for f in parsed_schema(codec)["fields"] if f["name"] == field]
    return list(f["type"]["symbols"])


def test_a_pause_reason_with_control_characters_is_refused() -> None:
    doc = json.loads(encode_request(Request("pause", "job", 1, 10**18, RID, reason="ok")))
    with pytest.raises(DecodeError, match="request: reason"):
        decode_request(request_key("job", RID), json.dumps(doc | {"reason": "\x1b[2Jgone"}).encode())
