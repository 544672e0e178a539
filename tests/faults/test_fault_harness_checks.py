"""The fault harness's own judgements, without a cluster: which worker log lines a network fault
explains, and that a machine without namespaces/nftables skips (fails under CI=true)."""

from __future__ import annotations

import pytest

from tests.faults import fault_audit, fault_harness
from tests.faults.fault_audit import unexpected_log_lines


def test_only_the_lines_a_network_fault_explains_pass() -> None:
    explained = "\n".join([
        "2026-12-04 13:16:31,982 ERROR aiokafka.consumer.group_coordinator Group Coordinator Request "
        "failed: [Error 15] GroupCoordinatorNotAvailableError",
        "2026-12-04 13:15:33,527 ERROR aiokafka.consumer.group_coordinator Heartbeat session expired - "
        "marking coordinator dead",
        "2026-12-04 13:17:11,893 ERROR aiokafka Unable connect to node with id 2: StaleMetadata: x",
        "2026-12-04 15:24:26,933 ERROR aiokafka.consumer.group_coordinator Group Coordinator Request "
        "failed: [Error 7] RequestTimedOutError",
        "2026-12-04 13:15:31,241 WARNING streamsched.kafka.owner fenced out of t[1]",
        "Traceback (most recent call last):", '  File "x.py", line 1, in f', "    raise",
        "aiokafka.errors.KafkaConnectionError: Connection at 10.231.1.11:9092 closed",
    ])
    assert unexpected_log_lines(explained) == []
    unexplained = [
        "2026-12-04 13:15:31,241 ERROR streamsched.kafka.owner owner of t[0] failed: boom",
        "2026-12-04 13:15:31,241 ERROR aiokafka Unexpected error in sender routine",
        "Task exception was never retrieved",
        "Future exception was never retrieved",
    ]
    for line in unexplained:
        assert unexpected_log_lines(explained + "\n" + line) == [line], line
    bad_traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'p'\n"
    assert unexpected_log_lines(bad_traceback) == ["Traceback (most recent call last): ... KeyError: 'p'"]


@pytest.mark.parametrize("ci", ["", "true"])
def test_no_namespaces_skips_locally_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setattr(fault_harness, "network_tools_missing", lambda: "nft not found")
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="nft not found"), fault_harness.network():
        raise AssertionError("a network without the tools")


def test_a_call_after_its_lease_expired_and_a_successor_claimed_is_caught() -> None:
    from consumers.harness import Call
    from streamsched.model.claims import ClaimState, ClaimStatus

    s = 10**9
    history = {"k": [ClaimState("k", ClaimStatus.CLAIMED, "a-1-x", fence=1, lease_expires_ns=5 * s),
                     ClaimState("k", ClaimStatus.CLAIMED, "b-2-y", fence=2, lease_expires_ns=11 * s)],
               "j": [ClaimState("j", ClaimStatus.CLAIMED, "a-1-x", fence=1, lease_expires_ns=5 * s)]}
    within = [Call("k", 1, 4 * s), Call("k", 2, 7 * s), Call("j", 1, 9 * s)]  # j: nobody took over
    assert fault_audit.calls_after_lease(within, history) == []
    assert fault_audit.calls_after_lease([*within, Call("k", 1, 6 * s)], history) == ["k"]


def test_an_unretrieved_future_is_always_unexpected() -> None:
    report = "\n".join([
        "2026-12-04 13:46:26,359 ERROR asyncio Future exception was never retrieved",
        "future: <Future finished exception=ProducerFenced('There is a newer producer')>",
        "Traceback (most recent call last):", '  File "sender.py", line 175, in _sender_routine',
        "aiokafka.errors.ProducerFenced: ProducerFenced: There is a newer producer",
    ])
    assert len(unexpected_log_lines(report)) == 2  # the report and its traceback
    assert len(unexpected_log_lines(report, allow=fault_audit.BROKER_DOWN_ERRORS)) == 2


def test_a_killed_brokers_lines_pass_only_where_a_scenario_allows_them() -> None:
    lines = [
        '2026-12-04 14:55:03,133 ERROR aiokafka Unable connect to "10.231.246.10:41853": [Errno 111] '
        "Connect call failed ('10.231.246.10', 41853)",
        "2026-12-04 14:58:23,353 ERROR aiokafka.consumer.fetcher Failed fetch messages from 1: "
        "KafkaConnectionError: Connection at 10.231.193.10:54369 closed",
        "2026-12-04 15:08:44,265 ERROR aiokafka.consumer.group_coordinator Heartbeat send request failed: "
        "NodeNotReadyError: Attempt to send a request to node which is not ready (node id 1).. Will retry.",
    ]
    text = "\n".join(lines)
    # A network cut neither refuses nor closes. A heartbeat not sent to a node that is skipped or
    # no longer in the metadata is expected in every scenario.
    assert unexpected_log_lines(text) == lines[:2]
    assert unexpected_log_lines(text, allow=fault_audit.BROKER_DOWN_ERRORS) == []
    other = "2026-12-04 15:08:44,265 ERROR aiokafka Unexpected error in sender routine"
    assert unexpected_log_lines(f"{text}\n{other}", allow=fault_audit.BROKER_DOWN_ERRORS) == [other]


def test_a_cut_off_coordinators_unknown_error_passes_only_where_the_scenario_allows_it() -> None:
    lines = [
        "2026-12-04 22:20:41,380 ERROR aiokafka.producer.sender Could not end transaction due to "
        "unexpected error: <class 'aiokafka.errors.UnknownError'>",
        "2026-12-04 22:20:41,380 ERROR aiokafka.producer.sender Unexpected error in sender routine",
        "Traceback (most recent call last):",
        '  File "sender.py", line 175, in _sender_routine',
        "aiokafka.errors.UnknownError: [Error -1] UnknownError",
    ]
    assert len(unexpected_log_lines("\n".join(lines))) == 3
    assert unexpected_log_lines("\n".join(lines), allow=fault_audit.CUT_BROKER_ERRORS) == []
    # Any other error ending the sender routine is still reported.
    other = [*lines[1:4], "aiokafka.errors.KafkaError: InvalidTxnState"]
    assert len(unexpected_log_lines("\n".join(other), allow=fault_audit.CUT_BROKER_ERRORS)) == 1
