"""``inspect`` shows the attempt with the run it belongs to, and a parked retry's due time.

The view's text alone (no broker); tests/worker/test_retry_budget_kafka.py reads a real one.
"""

from __future__ import annotations

from dataclasses import replace

from streamsched.ops.inspect import IdentityView, format_view

BASE = IdentityView(scheduler="charges", identity="sched_" + "a" * 64, transition_topic="invoices",
                    state_topic="__streamsched.state.charges", partition=0, found=True, status="RELEASED",
                    fence=4, revision=9, ordinal=4, max_attempts=3, committed_offset=3)


def rows(view: IdentityView) -> dict[str, str]:
    """Row name -> value (names are padded to the longest, "state records read")."""
    width = len("state records read")
    return {line[:width].rstrip(): line[width + 2:] for line in format_view(view).splitlines()}


def test_a_parked_identity_shows_its_attempt_run_and_when_its_retry_is_due() -> None:
    view = replace(BASE, attempt=2, run=1, retry_due_ns=1_767_225_602_000_000_000)
    shown = rows(view)
    assert shown["attempt"] == "2 of 3, run 1"
    assert shown["retry due"] == "2026-01-01T00:00:02.000Z (attempt 3)"
    assert shown["resolved"] == "no: parked for a retry, which a delivery before it is due joins"
    assert view.to_dict()["run"] == 1 and view.to_dict()["retry_due_ns"] == 1_767_225_602_000_000_000


def test_a_redriven_identity_shows_its_new_run() -> None:
    view = replace(BASE, attempt=1, run=2, outcome="SUCCEEDED")
    shown = rows(view)
    assert shown["attempt"] == "1 of 3, run 2" and "retry due" not in shown
    assert shown["resolved"] == "yes: a redelivery releases without running"
