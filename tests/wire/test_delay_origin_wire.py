"""The parked copy's origin headers and the dead letter's delay headers: each writer beside its
reader, and records written before they existed still read (the origin as unknown, no delay)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from streamsched.wire.dead_letter import DeadLetterView, dead_letter, view_dead_letter
from streamsched.wire.delay import ORIGIN_HEADERS, RecordRef, due_headers, due_ns, parked_origin

DELAY = "__streamsched.delay.charges"
ORIGIN = RecordRef("invoices", 3, 41)


def consumed(record: Any, *, partition: int = 3, offset: int = 7) -> SimpleNamespace:
    """A DLQ record as a consumer returns it."""
    return SimpleNamespace(partition=partition, offset=offset, key=record.key, value=record.value,
                           headers=tuple(record.headers), timestamp=1_700_000_000_000)


def test_a_parked_copy_carries_its_origin() -> None:
    headers = due_headers(123, ORIGIN)
    assert due_ns(headers) == 123
    assert parked_origin(headers) == ORIGIN


def test_a_copy_parked_before_origins_were_carried_has_none() -> None:
    old = [("ss-due-ns", b"123")]  # all a parked copy carried before
    assert due_ns(old) == 123 and parked_origin(old) is None
    assert due_headers(123) == old  # an unknown origin is written as before
    assert parked_origin(None) is None


@pytest.mark.parametrize("bad", [
    {"ss-origin-offset": None},  # a part missing
    {"ss-origin-offset": b"-1"},
    {"ss-origin-offset": b"41x"},
    {"ss-origin-offset": str(2**63).encode()},
    {"ss-origin-partition": str(2**31).encode()},
    {"ss-origin-topic": b"bad topic"},
    {"ss-origin-topic": b"__streamsched.state.x"},  # never an internal topic
    {"ss-origin-topic": b"\xff"},
])
def test_a_malformed_origin_is_unknown_never_an_error(bad: dict[str, bytes | None]) -> None:
    good = dict(due_headers(5, ORIGIN))
    headers = [(k, bad.get(k, v)) for k, v in good.items() if not (k in bad and bad[k] is None)]
    assert parked_origin(headers) is None  # type: ignore[arg-type]
    assert due_ns(headers) == 5  # type: ignore[arg-type]


def test_the_first_origin_header_counts() -> None:
    headers = due_headers(5, ORIGIN) + [(name, b"9") for name in ORIGIN_HEADERS]
    assert parked_origin(headers) == ORIGIN


def _letter(*, source_offset: int, delay: RecordRef | None) -> Any:
    return dead_letter(kind="terminal", reason="handler_terminal", source_topic="invoices",
                       source_partition=3, source_offset=source_offset, attempt=3, at_ns=1, original=b"v",
                       original_key=b"k", delay=delay)


def test_a_dead_letter_names_its_transition_record_and_its_parked_copy() -> None:
    via = RecordRef(DELAY, 3, 12)
    record = _letter(source_offset=41, delay=via)
    headers = dict(record.headers)
    assert (headers["ss-source-offset"], headers["ss-delay-topic"], headers["ss-delay-offset"]) == (
        b"41", DELAY.encode(), b"12")
    view = view_dead_letter(consumed(record))
    assert (view.source_topic, view.source_partition, view.source_offset) == ("invoices", 3, 41)
    assert view.delay == via and view.origin_known
    safe = view.safe_dict()
    assert (safe["source_offset"], safe["origin_known"]) == (41, True)
    assert (safe["delay_topic"], safe["delay_partition"], safe["delay_offset"]) == (DELAY, 3, 12)
    assert "original" not in safe and "original_key" not in safe


def test_a_dead_letter_of_an_old_parked_copy_says_its_origin_is_unknown() -> None:
    via = RecordRef(DELAY, 3, 12)
    view = view_dead_letter(consumed(_letter(source_offset=-1, delay=via)))
    assert not view.origin_known and view.delay == via
    assert (view.safe_dict()["source_offset"], view.safe_dict()["origin_known"]) == (-1, False)


def test_a_dead_letter_from_the_transition_topic_has_no_delay() -> None:
    record = _letter(source_offset=41, delay=None)
    assert not any(k.startswith("ss-delay-") for k, _ in record.headers)  # written as before
    view = view_dead_letter(consumed(record))
    assert view.delay is None and view.origin_known
    assert view.safe_dict()["delay_topic"] is None


def test_views_built_without_a_delay_still_work() -> None:
    view = DeadLetterView(partition=0, offset=1, kind="decode", source_topic="t", source_partition=0,
                          source_offset=5, attempt=1, at_ns=0, reason="truncated")
    assert view.delay is None and view.origin_known
