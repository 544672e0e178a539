"""How a partition owner's failure is logged (streamsched/kafka/ownerfaults.py): an unexpected
exception (a defect) as ERROR with its traceback, frames and types only; a routine fault of the
cluster or the machine (a broker gone, a stale leader, a stuck transaction...) as one WARNING,
which the fault matrix's audit of ERROR lines and tracebacks must not see as a defect."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, ProducerFenced, UnknownError

from streamsched.errors import ChangelogBehind, StoreUnwritable, TransactionStuck
from streamsched.kafka.owner import Body, PartitionOwner
from streamsched.kafka.ownerfaults import InjectedFault, routine
from streamsched.logs import TextFormatter
from tests.kafka.test_owner import World, make, until

SECRET = "payload-SECRET"


class Failing(World):
    """Partition 0's body fails with ``self.error`` once restored."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def restore(self, owner: PartitionOwner[str]) -> Body[str]:
        body = await super().restore(owner)

        async def run() -> None:
            raise self.error

        return Body(part=body.part, run=run, wake=body.wake)


def _defect() -> AttributeError:
    """An AttributeError (its message quoting payload) raised from another one."""
    try:
        try:
            None.missing  # type: ignore[attr-defined]  # noqa: B018 - the defect under test
        except AttributeError as exc:
            raise AttributeError(SECRET) from exc
    except AttributeError as outer:
        return outer
    raise AssertionError("unreachable")


async def failed_lines(error: BaseException, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.set_level(logging.WARNING, logger="streamsched.kafka.owner")
    world = Failing(error)
    owners, _ = make(world)
    await owners.assign([0])
    await until(lambda: (o := owners.get(0)) is not None and o.task.done(), "the owner failed")
    await owners.close()
    return [r for r in caplog.records if r.name == "streamsched.kafka.owner"]


async def test_an_unexpected_exception_in_an_owner_is_an_error_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    [record] = await failed_lines(_defect(), caplog)
    assert record.levelno == logging.ERROR
    line = TextFormatter().format(record)
    head, _, trace = line.partition("\n")
    assert head.endswith("ERROR streamsched.kafka.owner owner of t[0] failed: AttributeError")
    # The traceback the fault audit judges: frames and types, never a message.
    assert trace.startswith("Traceback (most recent call last):") and "in _main" in trace
    assert trace.endswith("\nAttributeError") and "direct cause" in trace
    assert SECRET not in line


@pytest.mark.parametrize("error", [
    ChangelogBehind("state.t", 0, 10, 5),
    TransactionStuck("commit did not commit within 60s"),
    StoreUnwritable("state.t", 0, "No space left on device"),
    InjectedFault("injected owner failure"),
    KafkaConnectionError("Connection at 10.0.0.1:9092 closed"),
    KafkaTimeoutError(),
    UnknownError(),
    TimeoutError(),
], ids=lambda e: type(e).__name__)
async def test_a_routine_owner_failure_is_one_warning_without_traceback(
        error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    [record] = await failed_lines(error, caplog)
    assert record.levelno == logging.WARNING and record.exc_info is None
    message = record.getMessage()
    assert message.startswith(f"owner of t[0] failed: {type(error).__name__} (") and "\n" not in message


def test_what_is_routine_and_what_is_not() -> None:
    for fault in (KafkaConnectionError(), ConnectionResetError(), KafkaTimeoutError()):
        assert routine(fault), fault
    for defect in (AttributeError(), KeyError("k"), AssertionError(), ValueError(), FileNotFoundError()):
        assert routine(defect) is None, defect
    assert routine(ProducerFenced()) is None  # a fence is told apart before: "fenced out of t[p]"
