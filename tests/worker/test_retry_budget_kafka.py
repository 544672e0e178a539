"""The retry budget belongs to the identity, on a real broker: calls counted.

With ``RetryPolicy(maximum_attempts=3)``, an identity whose command failed twice and whose event
is published again (a new event id) while its retry is parked is called three times in all, not
five; re-driven from the dead-letter topic after that, it starts a new run at attempt 1 and gets
its retries (``inspect`` shows the run beside the attempt). The in-memory counterparts, and the
model of every state a duplicate can meet, are tests/worker/test_retry_budget*.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from streamsched.model.retry import RetryPolicy
from streamsched.ops.inspect import format_view, inspect_identity
from streamsched.ops.redrive import redrive, targets_from_dlq
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from tests.conftest import TopicFactory
from tests.worker.test_retry_budget import Script

pytestmark = [pytest.mark.kafka, pytest.mark.dlq]

BACKOFF_S = 4.0
"""Every retry parks (longer than an in-place wait); long enough that the event published again
right after the second failure is read while the retry is parked. (Were it read later, it would
run that retry itself, as attempt 3: the count below is the same either way.)"""
POLICY = RetryPolicy(initial_interval_s=BACKOFF_S, backoff_coefficient=1.0, maximum_interval_s=BACKOFF_S,
                     maximum_attempts=3, jitter=0.0)


def holds(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


async def test_a_duplicate_joins_the_parked_retry_and_a_dlq_redrive_starts_a_new_run(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    topic = await make_topic("budget", partitions=2)
    command = Script(failures=3)
    name = unique("budget").replace("-", "_")
    sched = command.app(POLICY, name=name, topic=topic, claim_duration_s=5).schedulers[name]
    first = make_event("due", "acme", ["inv-1"])
    async with running_worker(sched, bootstrap) as worker:
        await produce_events(bootstrap, topic, [first])
        await wait_for(holds(lambda: len(command.attempts) == 2), timeout=60, what="two failed attempts")
        # The service publishes the event again (a new event id) while the retry is parked.
        again = make_event("due", "acme", ["inv-1"])
        assert again.event_id != first.event_id
        await produce_events(bootstrap, topic, [again])
        await wait_for(holds(lambda: len(command.attempts) >= 3), timeout=60, what="the third attempt")
        # Drained (the delay topic too): nothing of the identity is pending any more.
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
        # One budget (before, the copy started a count of its own: 1, 2, 1, ...).
        assert command.attempts == [1, 2, 3]
        assert worker.metrics.counters.get("retry_joined", 0) + worker.metrics.counters.get(
            "skipped_outcome", 0) >= 1  # the copy joined the retry (or, read late, met its outcome)

        exhausted = await inspect_identity(bootstrap, sched, event=first, progress=False)
        assert (exhausted.outcome, exhausted.attempt, exhausted.run) == ("FAILED", 3, 1)

        # Re-driven from the dead-letter topic once the cause is fixed: one transient failure is
        # left, which the new run retries (before, it started at attempt 3 and failed for good).
        command.failures = 1
        [target] = await targets_from_dlq(bootstrap, sched)
        assert target.event is not None and target.event.attempt == 3  # the parked copy's
        report = await redrive(bootstrap, sched, [target], reason="fixed", progress=False)
        assert len(report.requested) == 1
        await wait_for(holds(lambda: len(command.attempts) == 5), timeout=60, what="the re-driven run")
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
    assert command.attempts == [1, 2, 3, 1, 2]
    view = await inspect_identity(bootstrap, sched, event=first, progress=False)
    assert (view.outcome, view.attempt, view.max_attempts, view.run) == ("SUCCEEDED", 2, 3, 2)
    assert "attempt             2 of 3, run 2" in format_view(view)
