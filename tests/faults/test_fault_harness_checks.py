"""The fault harness's own judgements, without a cluster: which worker log records a fault
explains (lines, tracebacks by the path that raised them, owner failures), how owner restarts
are counted and bounded, the atomicity check of a stopped group, and that a machine without
namespaces/nftables skips (fails under CI=true)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from consumers.harness import Workflow
from streamsched.model.names import internal_topic
from streamsched.testing import make_event
from streamsched.wire.transition import encode_transition
from tests.faults import fault_audit, fault_harness, fault_logs
from tests.faults.fault_logs import RestartBound, judge_logs, owner_restarts, unexpected_log_lines


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
    assert len(unexpected_log_lines(report, allow=[fault_logs.BROKER_DOWN_ERRORS])) == 2


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
    assert unexpected_log_lines(text, allow=[fault_logs.BROKER_DOWN_ERRORS]) == []
    other = "2026-12-04 15:08:44,265 ERROR aiokafka Unexpected error in sender routine"
    assert unexpected_log_lines(f"{text}\n{other}", allow=[fault_logs.BROKER_DOWN_ERRORS]) == [other]


# aiokafka 0.14's own lines and tracebacks (Python 3.11), as its sender logs them when an answer
# ends its routine: an EndTxn answered UNKNOWN_SERVER_ERROR, and an AddPartitionsToTxn answered
# so (taken from the real sender.py run against a stub client answering error code -1).
SENDER = "/venv/lib/python3.11/site-packages/aiokafka/producer/sender.py"
END_TXN = [
    "2026-12-06 05:06:07,479 ERROR aiokafka.producer.sender Could not end transaction due to unexpected "
    "error: <class 'aiokafka.errors.UnknownError'>",
    "2026-12-06 05:06:07,479 ERROR aiokafka.producer.sender Unexpected error in sender routine",
    "Traceback (most recent call last):",
    f'  File "{SENDER}", line 175, in _sender_routine', "    task.result()",
    f'  File "{SENDER}", line 384, in _do_txn_commit', "    await handler.do(node_id)",
    f'  File "{SENDER}", line 410, in do', "    retry_backoff = self.handle_response(resp)",
    "                    ^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{SENDER}", line 742, in handle_response', "    raise error_type()",
    "aiokafka.errors.UnknownError: [Error -1] UnknownError",
]
ADD_PARTITIONS = [
    "2026-12-06 05:06:07,694 ERROR aiokafka.producer.sender Could not add partition 0 due to unexpected "
    "error: <class 'aiokafka.errors.UnknownError'>",
    "2026-12-06 05:06:07,695 ERROR aiokafka.producer.sender Unexpected error in sender routine",
    "Traceback (most recent call last):",
    f'  File "{SENDER}", line 175, in _sender_routine', "    task.result()",
    f'  File "{SENDER}", line 330, in _do_add_partitions_to_txn', "    return await handler.do(node_id)",
    f'  File "{SENDER}", line 410, in do', "    retry_backoff = self.handle_response(resp)",
    f'  File "{SENDER}", line 545, in handle_response', "    raise error_type()",
    "aiokafka.errors.UnknownError: [Error -1] UnknownError",
]


def owner_failed(cause: list[str]) -> list[str]:
    """The owner whose producer's sender ended on ``cause`` (the traceback lines of a sender
    record): its ERROR line and the chain, as streamsched's safe traceback renders it (types only)."""
    return [
        "2026-12-06 05:06:07,702 ERROR streamsched.kafka.owner owner of runs.x[2] failed: KafkaError",
        *cause[:-1], "aiokafka.errors.UnknownError", "",
        "The above exception was the direct cause of the following exception:", "",
        "Traceback (most recent call last):",
        '  File "/work/streamsched/kafka/owner.py", line 237, in _main', "    await run_body(self.body.run)",
        '  File "/work/streamsched/kafka/txn.py", line 56, in transaction',
        "    await producer.commit_transaction()",
        f'  File "{SENDER}", line 191, in _sender_routine',
        '    raise KafkaError("Unexpected error during batch delivery") from exc',
        "aiokafka.errors.KafkaError",
    ]


def test_a_cut_off_coordinators_end_txn_passes_only_where_the_scenario_allows_it() -> None:
    text = "\n".join([*END_TXN, *owner_failed(END_TXN[2:])])
    found = unexpected_log_lines(text)
    assert END_TXN[0] in found and END_TXN[1] in found and any("owner of" in f for f in found), found
    assert unexpected_log_lines(text, allow=[fault_logs.CUT_BROKER_ERRORS]) == []
    # Any other error ending the routine on the EndTxn path is still reported.
    other = "\n".join([*END_TXN[1:-1], "aiokafka.errors.KafkaError: InvalidTxnState"])
    assert len(unexpected_log_lines(other, allow=[fault_logs.CUT_BROKER_ERRORS])) == 2  # line, traceback


def test_a_position_reset_told_not_leader_passes_only_where_a_broker_is_cut_off() -> None:
    line = ("2026-12-06 16:06:29,071 ERROR aiokafka.consumer.fetcher Failed fetch offsets from 2: "
            "[Error 6] NotLeaderForPartitionError: TopicPartition(topic='runs.t', partition=3)")
    assert unexpected_log_lines(line) == [line]
    assert unexpected_log_lines(line, allow=[fault_logs.CUT_BROKER_ERRORS]) == []
    # Another error of the same lookup is still reported.
    other = line.replace("[Error 6] NotLeaderForPartitionError", "[Error 3] UnknownTopicOrPartitionError")
    assert unexpected_log_lines(other, allow=[fault_logs.CUT_BROKER_ERRORS]) == [other]


def test_an_unknown_error_ending_the_sender_elsewhere_is_still_reported() -> None:
    # The same UnknownError, the same last line, but answering an AddPartitionsToTxn: no cut
    # coordinator's EndTxn explains it, so neither the routine's end nor the owner's failure passes.
    text = "\n".join([*ADD_PARTITIONS, *owner_failed(ADD_PARTITIONS[2:])])
    found = unexpected_log_lines(text, allow=[fault_logs.CUT_BROKER_ERRORS])
    assert ADD_PARTITIONS[1] in found, found
    assert f"Traceback (most recent call last): ... {ADD_PARTITIONS[-1]}" in found
    assert owner_failed([])[0] in found, found


def test_an_owner_failure_is_judged_at_any_level_and_only_a_scenarios_fault_explains_it() -> None:
    routine = ("2026-12-06 05:06:07,702 WARNING streamsched.kafka.owner owner of t[1] failed: "
               "KafkaTimeoutError (the cluster did not answer as it should)")
    assert unexpected_log_lines(routine) == [routine]  # no fault in this scenario explains it
    assert unexpected_log_lines(routine, allow=[fault_logs.BROKER_FAULT_OWNERS]) == []
    defect = "2026-12-06 05:06:07,702 WARNING streamsched.kafka.owner owner of t[1] failed: KeyError"
    assert unexpected_log_lines(defect, allow=[fault_logs.BROKER_FAULT_OWNERS]) == [defect]
    injected = "2026-12-06 05:06:07,702 WARNING streamsched.kafka.owner owner of t[1] failed: InjectedFault"
    assert unexpected_log_lines(injected, allow=[fault_logs.INJECTED_OWNER_FAULTS]) == []
    assert unexpected_log_lines(injected, allow=[fault_logs.BROKER_FAULT_OWNERS]) == [injected]
    # Logged as unexpected (ERROR, with its traceback), even an explained type is not routine.
    unexpected = "\n".join([routine.replace("WARNING", "ERROR").split(" (")[0],
                            "Traceback (most recent call last):",
                            '  File "/work/streamsched/kafka/owner.py", line 237, in _main', "    x()",
                            "aiokafka.errors.KafkaTimeoutError"])
    assert len(unexpected_log_lines(unexpected, allow=[fault_logs.BROKER_FAULT_OWNERS])) == 2


def test_a_kafka_timeout_traceback_is_no_longer_explained_everywhere() -> None:
    def under_a_warning(exc: str) -> str:
        return "\n".join(["2026-12-06 05:06:07,702 WARNING x something went wrong",
                          "Traceback (most recent call last):", '  File "x.py", line 1, in f', "    raise",
                          exc])

    assert unexpected_log_lines(under_a_warning("aiokafka.errors.KafkaConnectionError: closed")) == []
    assert unexpected_log_lines(under_a_warning("aiokafka.errors.KafkaTimeoutError")) == [
        "Traceback (most recent call last): ... aiokafka.errors.KafkaTimeoutError"]


def test_owner_restarts_come_from_the_exit_metrics_or_the_restarts_a_killed_process_scheduled() -> None:
    restart = "2026-12-06 05:06:07,702 WARNING streamsched.kafka.owner restarting t[{p}] in 0.5s (failure 1)"
    snapshot = '{"scheduler": "s", "counters": {"partition_restarts": 3}, "gauges": {}}'
    clean = "\n".join([restart.format(p=0), restart.format(p=1), restart.format(p=1), snapshot])
    assert owner_restarts(clean) == 3  # the metric, not the lines (a revoke cancels a scheduled one)
    killed = "\n".join([clean, restart.format(p=2), restart.format(p=3)])  # a second process, killed
    assert owner_restarts(killed) == 5
    assert owner_restarts('{"scheduler": "s", "counters": {}, "gauges": {}}') == 0
    both = {"a": clean, "b": killed}
    assert judge_logs(both, restarts=RestartBound(8, "two processes")) == {"a": 3, "b": 5}
    with pytest.raises(AssertionError, match=r"8 owner restarts .* more than 7: why"):
        judge_logs(both, restarts=RestartBound(7, "why"))


def test_an_offset_committed_ahead_of_its_outcome_is_caught_and_parked_work_is_not() -> None:
    wf = Workflow("due_runs", ".checks", Path("/nonexistent/ledger.sqlite3"))
    delay = internal_topic("delay", wf.name)
    done, open_, parked = (make_event("due", "t", [name], due_ns=1) for name in ("done", "open", "parked"))
    noise = make_event("noise", "t", ["n"])

    def recs(*events: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(partition=0, offset=i, value=encode_transition(ev))
                for i, ev in enumerate(events)]

    records = {wf.topic: recs(done, open_, parked, noise), delay: recs(parked)}
    resolved = {wf.identity(done)}
    # Committed up to "done" only: nothing leads.
    assert fault_audit.offsets_ahead(wf, records, {wf.topic: {0: 1}, delay: {0: 0}}, resolved) == []
    # Past all four: "open" has neither an outcome nor a parked copy; "parked" waits on the delay
    # topic (its copy not yet consumed); the noise is no selected event.
    past = {wf.topic: {0: 4}, delay: {0: 0}}
    assert fault_audit.offsets_ahead(wf, records, past, resolved) == [(wf.topic, 0, 1)]
    # The delay topic committed past the copy too, still no outcome: both lead.
    past[delay] = {0: 1}
    ahead = fault_audit.offsets_ahead(wf, records, past, resolved)
    assert ahead == [(wf.topic, 0, 1), (wf.topic, 0, 2), (delay, 0, 0)]
    resolved |= {wf.identity(open_), wf.identity(parked)}
    assert fault_audit.offsets_ahead(wf, records, past, resolved) == []
