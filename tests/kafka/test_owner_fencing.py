"""Two owners of one partition on a real broker: the newer fences the older, which ends with one
log line and no ``Future exception was never retrieved ... ProducerFenced`` tracebacks (4m)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable

import pytest

from streamsched.kafka.owner import Body, Owners, OwnerSpec, PartitionOwner, RestartPolicy
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.testing import wait_for


def owners_of(bootstrap: str, topic: str, txn_id: str, commits: list[int]) -> tuple[Owners[None], Metrics]:
    """A member whose body commits a transaction of a few records on every partition of
    ``topic`` in a loop (like a turn: grouped writes, several partitions per transaction)."""

    async def restore(owner: PartitionOwner[None]) -> Body[None]:
        async def run() -> None:
            while not owner.stopping:
                writer = GroupedWriter(owner.producer)
                await owner.producer.begin_transaction()
                try:
                    for p in range(3):
                        writer.add(topic, b"x", key=b"k", partition=p)
                    await writer.flush()
                    await owner.producer.commit_transaction()
                except BaseException:
                    with contextlib.suppress(Exception):  # a fenced producer cannot abort
                        await owner.producer.abort_transaction()
                    raise
                commits.append(owner.partition)
                await asyncio.sleep(0.02)

        return Body(part=None, run=run)

    metrics = Metrics("fencing_test")
    spec: OwnerSpec[None] = OwnerSpec(name=topic, bootstrap=bootstrap, transactional_id=lambda _p: txn_id,
                                      restore=restore, policy=RestartPolicy(initial_s=0.05))
    return Owners(spec, metrics), metrics


async def test_fenced_owner_logs_one_line_and_no_unretrieved_futures(
        bootstrap: str, make_topic: Callable[..., object], unique: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    # Futures left unretrieved by earlier tests of the session (e.g. a raw fencing check) would
    # be collected, and logged, inside this test's window: collect them before it opens.
    gc.collect()
    await asyncio.sleep(0)
    caplog.set_level(logging.WARNING)
    caplog.clear()
    topic = await make_topic("fence", partitions=3)  # type: ignore[misc]
    txn_id = unique("tx")
    old_commits: list[int] = []
    new_commits: list[int] = []
    old, old_metrics = owners_of(bootstrap, topic, txn_id, old_commits)
    new, _ = owners_of(bootstrap, topic, txn_id, new_commits)
    await old.assign([0])

    async def committed(commits: list[int], n: int) -> bool:
        return len(commits) >= n

    await wait_for(lambda: committed(old_commits, 3), timeout=30, what="the first owner's commits")
    await new.assign([0])  # the same transactional id: its start fences the first owner
    await wait_for(lambda: committed(new_commits, 3), timeout=30, what="the second owner's commits")
    await wait_for(lambda: _done(old), timeout=30, what="the first owner to notice")
    first = old.get(0)
    assert first is not None and first.fenced and not first.crashed and not old.ready and new.ready
    await old.supervise()
    assert old.get(0) is first  # a fenced owner waits for its revoke: a restart would fence back
    await old.close()
    await new.close()
    assert old.producers_live == new.producers_live == 0
    del first
    gc.collect()
    await asyncio.sleep(0.1)
    gc.collect()

    text = caplog.text
    assert "Future exception was never retrieved" not in text
    assert "Task exception was never retrieved" not in text
    assert "Traceback" not in text
    assert text.count("fenced out of") == 1
    assert old_metrics.snapshot()["counters"]["fenced"] == 1
    records = await read_topic(bootstrap, topic)
    assert len(records) == 3 * (len(old_commits) + len(new_commits))  # aborted writes invisible


async def _done(owners: Owners[None]) -> bool:
    owner = owners.get(0)
    return owner is not None and owner.task.done()
