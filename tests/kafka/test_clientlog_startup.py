"""A healthy start logs no ERROR (streamsched/kafka/clientlog.py ``CoordinatorStartup``): while a
group member starts, aiokafka's retriable coordinator-lookup failures (a fresh cluster creating
``__consumer_offsets`` answers COORDINATOR_NOT_AVAILABLE for a few seconds) are INFO; past the
grace period (from the process's first group member), or for a refusal, they stay ERROR."""

from __future__ import annotations

import inspect
import io
import logging

import pytest
from aiokafka.consumer import group_coordinator
from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

from streamsched.kafka import clientlog, clients
from streamsched.logs import TextFormatter


def lookup_failed(error: BaseException) -> logging.LogRecord:
    return logging.LogRecord(clientlog.COORDINATOR_LOGGER, logging.ERROR, __file__, 1,
                             "Group Coordinator Request failed: %s", (error,), None)


def test_retriable_lookup_failures_are_info_until_the_grace_period_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    startup = clientlog.CoordinatorStartup(clock=lambda: now[0], grace_s=60)
    caplog.set_level(logging.INFO, logger=clientlog.COORDINATOR_LOGGER)
    early = lookup_failed(GroupCoordinatorNotAvailableError())
    assert startup.filter(early) and early.levelno == logging.ERROR  # no member started yet: as it is
    startup.starting()
    now[0] = 59.0
    record = lookup_failed(GroupCoordinatorNotAvailableError())
    assert startup.filter(record) and (record.levelno, record.levelname) == (logging.INFO, "INFO")
    dead = logging.LogRecord(clientlog.COORDINATOR_LOGGER, logging.WARNING, __file__, 1,
                             "Marking the coordinator dead (node %s)for group %s.", (1, "g"), None)
    assert startup.filter(dead) and dead.levelno == logging.INFO  # the join found it still loading
    refused = lookup_failed(GroupAuthorizationFailedError())
    assert startup.filter(refused) and refused.levelno == logging.ERROR  # not retriable: at once
    other = logging.LogRecord(clientlog.COORDINATOR_LOGGER, logging.ERROR, __file__, 1,
                              "Heartbeat session expired - marking coordinator dead", (), None)
    assert startup.filter(other) and other.levelno == logging.ERROR
    now[0] = 60.0
    late = lookup_failed(GroupCoordinatorNotAvailableError())
    assert startup.filter(late) and late.levelno == logging.ERROR  # still missing: a fault
    startup.starting()  # another group consumer later (the console reading lag): no new grace
    again = lookup_failed(GroupCoordinatorNotAvailableError())
    assert startup.filter(again) and again.levelno == logging.ERROR


async def test_at_the_default_level_a_starting_member_logs_nothing_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger(clientlog.COORDINATOR_LOGGER)
    monkeypatch.setattr(logger, "filters", [f for f in logger.filters
                                            if not isinstance(f, clientlog.CoordinatorStartup)])
    monkeypatch.setattr(clientlog, "_filters", {})
    out = io.StringIO()
    handler = logging.StreamHandler(out)  # as `streamsched run` logs: level NOTSET, logger at WARNING
    handler.setFormatter(TextFormatter())
    monkeypatch.setattr(logger, "handlers", [handler])
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    built = [clients.consumer("127.0.0.1:9", "t")]  # no group: nothing installed
    assert clientlog._filters == {}
    built += [clients.consumer("127.0.0.1:9", "t", group_id=g) for g in ("g", "g2")]  # never started
    for consumer in built:
        await consumer.stop()
    installed = [f for f in logger.filters if isinstance(f, clientlog.CoordinatorStartup)]
    assert len(installed) == 1
    # aiokafka's own call, as ensure_coordinator_known makes it:
    group_coordinator.log.error("Group Coordinator Request failed: %s", GroupCoordinatorNotAvailableError())
    assert out.getvalue() == ""
    group_coordinator.log.error("Group Coordinator Request failed: %s", GroupAuthorizationFailedError())
    assert " ERROR aiokafka.consumer.group_coordinator Group Coordinator Request failed: " in out.getvalue()


def test_aiokafka_still_logs_the_lookup_failure_this_filter_knows() -> None:
    source = inspect.getsource(group_coordinator.GroupCoordinator.ensure_coordinator_known)
    assert 'log.error("Group Coordinator Request failed: %s", err)' in source
    dead = inspect.getsource(group_coordinator.GroupCoordinator.coordinator_dead)
    assert '"Marking the coordinator dead (node %s)for group %s."' in dead
    assert group_coordinator.log.name == clientlog.COORDINATOR_LOGGER
