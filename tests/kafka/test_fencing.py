"""What a transactional producer given up at its transaction's deadline leaves behind once it
ends fenced: with :func:`streamsched.kafka.fencing.settle_sends`, nothing for asyncio to report.

No broker: the producer's metadata is filled in by hand and its sender routine is replaced by one
that delivers nothing (as with a transaction coordinator or leader that no longer answers) and
dies fenced when told (as aiokafka's does once a newer producer with the same transactional id
started); aiokafka's own ``Sender.start`` and ``Sender._fail_all`` run as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from aiokafka.errors import ProducerFenced
from aiokafka.protocol.metadata import MetadataResponse_v0

from streamsched.errors import TransactionStuck
from streamsched.kafka import clients
from streamsched.kafka import txn as txn_module
from streamsched.kafka.fencing import settle_producer_futures, settle_sends
from streamsched.kafka.txn import transaction
from streamsched.kafka.writer import GroupedWriter
from streamsched.testing import wait_for


@pytest.mark.parametrize("settle", [True, False], ids=["settled", "unsettled"])
async def test_what_a_producer_given_up_at_its_deadline_fails_once_fenced_is_retrieved(
        settle: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in tests/faults' broker cut as ``Future exception was never retrieved ...
    ProducerFenced``, made in ``MessageAccumulator.add_batch`` (a batch's future and its
    "drained" waiter) and in ``TransactionManager.begin_transaction`` (the transaction's waiter)."""
    monkeypatch.setattr(txn_module, "ABORT_DEADLINE_S", 0.05)  # the bounded abort, shortened
    producer = clients.transactional_producer("127.0.0.1:1", f"tx-fencing-{settle}")
    fenced = asyncio.Event()

    async def sender_routine() -> None:
        await fenced.wait()
        raise ProducerFenced()

    producer.client.cluster.update_metadata(MetadataResponse_v0(
        brokers=[(1, "127.0.0.1", 1)], topics=[(0, "t", [(0, 0, 1, [1], [1]), (0, 1, 1, [1], [1])])]))
    producer._txn_manager.set_pid_and_epoch(1, 0)  # as after InitProducerId
    producer._sender._sender_routine = sender_routine
    producer.start = producer._sender.start  # the sender only: there is no broker to bootstrap from
    if settle:
        settle_sends(producer)  # what every partition owner does to its producer
    await producer.start()
    acc = producer._message_accumulator
    try:
        writer = GroupedWriter(producer)
        writer.add("t", b"a", partition=0)
        writer.add("t", b"b", partition=1)
        with pytest.raises(TransactionStuck):
            await transaction(producer, writer.flush, deadline_s=0.2)
        futures: list[asyncio.Future[Any]] = [producer._txn_manager._transaction_waiter]
        futures += [f for q in acc._batches.values() for b in q for f in (b.future, b._drain_waiter)]
        assert len(futures) == 5
        # The owner's stop gives up on the producer waiting to deliver what is stuck, so its
        # sender lives on; what the owner settles then has not failed yet.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(producer.stop(), 0.05)
        assert settle_producer_futures(producer) is None
        fenced.set()  # the restart's fresh producer fences this one

        async def failed() -> bool:
            return all(f.done() for f in futures)

        await wait_for(failed, timeout=5, what="the dead sender to fail what it held")
        await asyncio.sleep(0)  # done callbacks run
        for fut in futures:
            assert fut._log_traceback is not settle, (settle, fut)
            fut.exception()  # the unsettled case, retrieved here so this test logs nothing
    finally:
        acc._batches.clear()
        await producer.client.close()


async def test_a_producer_whose_stop_was_cut_short_is_kept_until_its_sender_ends_then_closed() -> None:
    """Without a reference the garbage collector destroys the pending sender task ("Task was
    destroyed but it is pending"); a sender that never ends is cancelled after ``linger_s``."""
    import gc
    import weakref
    from types import SimpleNamespace

    from streamsched.kafka import fencing

    closed: list[str] = []

    class Stub:  # hashable by identity, like aiokafka's producer
        def __init__(self, name: str, sender: asyncio.Task[bool]) -> None:
            async def close() -> None:
                closed.append(name)

            self._sender = SimpleNamespace(sender_task=sender)
            self.client = SimpleNamespace(close=close)

    def producer_with(name: str, sender: asyncio.Task[bool]) -> Stub:
        return Stub(name, sender)

    fenced = asyncio.Event()
    first = producer_with("fenced", asyncio.create_task(fenced.wait()))
    never = producer_with("never", asyncio.create_task(asyncio.Event().wait()))
    fencing.linger(first)  # type: ignore[arg-type]
    fencing.linger(never, linger_s=0.2)  # type: ignore[arg-type]
    refs = [weakref.ref(first), weakref.ref(never)]
    del first, never
    gc.collect()
    assert all(r() is not None for r in refs)  # kept while their senders run
    fenced.set()

    async def both_closed() -> bool:
        return sorted(closed) == ["fenced", "never"]

    await wait_for(both_closed, timeout=5, what="both producers closed")
    await asyncio.sleep(0)
    gc.collect()
    assert all(r() is None for r in refs) and not fencing._LINGERING  # then let go
