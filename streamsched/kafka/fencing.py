"""What a fenced aiokafka producer leaves behind: telling fencing apart, and cleaning up.

Kept beside the owner runtime (:mod:`streamsched.kafka.owner`) because both concern aiokafka
0.14's transaction internals, read through :mod:`streamsched.kafka.compat` defensively (a missing
attribute is skipped, never raised):

* fencing shows up as ``ProducerFenced``, or wrapped by a caller's error, or only in the
  transaction manager's state (a later call on a fenced producer fails with an unrelated
  ``AssertionError``): :func:`is_fenced` and :func:`producer_fenced` look at all three, because
  a fenced owner must not be restarted while the group may still move its partition (it
  would fence the real owner back);
* a fenced producer fails every pending future at once and nobody awaits most of them, so
  asyncio would log ``Future exception was never retrieved ... ProducerFenced`` tracebacks at
  garbage collection (defect 4m): :func:`settle_sends` and :func:`settle_producer_futures`
  mark them seen, also when the producer is fenced only after its owner gave it up (a
  transaction stuck past its deadline, then the restart's fresh producer fences the old one),
  and the owner's one log line is the only trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from streamsched.errors import FencedOut
from streamsched.kafka import compat
from streamsched.kafka.protocols import Producer


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done callback: mark a future's exception as seen (it is handled elsewhere)."""
    if not fut.cancelled():
        fut.exception()


def _fenced_error() -> type[BaseException]:
    from aiokafka.errors import ProducerFenced

    return ProducerFenced  # type: ignore[no-any-return]


def _raised_from(exc: BaseException, errors: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` is, or was caused while handling, one of ``errors``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # also when wrapped by the caller's error
        if isinstance(cur, errors):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def is_fenced(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused while handling, a fencing error."""
    return _raised_from(exc, (_fenced_error(), FencedOut))


def producer_taken_over(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says another producer took this producer's
    ``transactional.id``: the producer is dead. (A group refusing offsets, also a fencing, is
    not: the producer aborts and goes on.)"""
    return _raised_from(exc, (_fenced_error(),))


def producer_fenced(producer: Producer | None) -> bool:
    """Whether aiokafka's transaction manager of ``producer`` ended fenced (a later call on a
    fenced producer fails with an unrelated ``AssertionError`` about its state)."""
    waiter = compat.transaction_waiter(producer)
    return (isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled()
            and isinstance(waiter.exception(), _fenced_error()))


def settle_producer_futures(producer: Producer) -> BaseException | None:
    """Retrieve the exceptions a fenced aiokafka producer leaves in its transaction futures.

    The transaction waiter, queued offset commits and the batches the dead sender never
    drained are failed together and awaited by nobody once the owner gave up. Returns the first
    exception found (None if none).
    """
    first: BaseException | None = None
    # Batches the dead sender never drained keep a failed "drained" waiter nobody awaits too.
    for fut in compat.producer_futures(producer):
        if fut.done() and not fut.cancelled():
            exc = fut.exception()
            first = first or exc
    return first


def settle_sends(producer: Producer) -> None:
    """Mark the result futures of ``producer``'s sends as retrieved once they fail.

    When a fenced producer fails a transaction, every batch future of it fails together; the
    caller awaits them with ``gather``, which raises the first and leaves the rest unretrieved
    (``Future exception was never retrieved`` tracebacks at garbage collection). Whoever awaits
    a future still gets its exception; only the GC-time report is silenced, as the owner logs
    the failure once. Call before ``start``.

    A transaction given up at its deadline leaves more behind: the owner's bounded ``stop`` of
    the producer gives up too while the producer waits to deliver what is stuck, so its sender
    lives on, and dies only when the restart's fresh producer fences it. By then the cancelled
    waits have let go of what it fails: each batch's future (``send_batch`` hands out a shield
    of it, and the ``gather`` the deadline cancelled cancels the shield, which then drops it),
    each undrained batch's "drained" waiter, the transaction's waiter (its commit or abort,
    shielded too) and the offsets future of ``send_offsets_to_transaction`` (shielded, and
    dropped from aiokafka's queue as it fails). The first and last are marked as they are made,
    the rest when the sender dies, after aiokafka failed them.
    """
    for name in ("send", "send_batch"):
        method = getattr(producer, name, None)
        if method is None or not asyncio.iscoroutinefunction(method):
            continue

        async def settled(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            fut = await _method(*args, **kwargs)
            if isinstance(fut, asyncio.Future):
                fut.add_done_callback(retrieve)
            return fut

        setattr(producer, name, settled)
    # A batch's future can fail before the sender dies (a produce answered "fenced"), and leave
    # the accumulator then: marked as it is made.
    compat.on_batch_made(producer, lambda fut: fut.add_done_callback(retrieve))
    # The waiters replaced while a producer lives ("drained" ones at each retry, the
    # transaction's at each begin) are settled once, where the dead sender left them.
    start = getattr(producer, "start", None)
    if start is not None and asyncio.iscoroutinefunction(start):

        async def started(_start: Any = start) -> None:
            await _start()
            compat.after_sender_ends(producer, lambda: settle_producer_futures(producer))

        producer.start = started  # type: ignore[method-assign]
    # aiokafka drops a failed offsets future from its queue: marked as it is made.
    txn = compat.transaction_manager(producer)
    add_offsets = getattr(txn, "add_offsets_to_txn", None)
    if txn is not None and callable(add_offsets):

        def settled_offsets(*args: Any, _add: Any = add_offsets, **kwargs: Any) -> Any:
            fut = _add(*args, **kwargs)
            if isinstance(fut, asyncio.Future):
                fut.add_done_callback(retrieve)
            return fut

        txn.add_offsets_to_txn = settled_offsets


LINGER_S = 90.0
"""How long a producer whose stop was cut short may wait to be fenced before its sender is
cancelled: past the owners' transaction timeout (60 s) the broker has aborted what it held."""
_LINGERING: set[Any] = set()
"""Producers :func:`linger` keeps (and the tasks closing them) until they are closed."""


def linger(producer: Producer, *, linger_s: float = LINGER_S) -> None:
    """Keep ``producer``, whose ``stop`` was cut short, until its sender task ends, then close
    its connections.

    The sender of a producer given up mid-transaction lives on until the next owner's producer
    fences it (see :func:`settle_sends`). Once its owner lets go of the producer nothing else
    refers to that task, and the garbage collector destroys it while pending ("Task was
    destroyed but it is pending", seen in tests/faults' broker cut after a rebalance). After
    ``linger_s`` the sender is cancelled (nobody may ever take the partition over)."""
    task = compat.sender_task(producer)
    if task is None or task.done():
        return
    loop = asyncio.get_running_loop()
    _LINGERING.add(producer)
    timer = loop.call_later(linger_s, task.cancel)

    async def close() -> None:
        client = compat.client_of(producer)
        try:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 5.0)
        finally:
            _LINGERING.discard(producer)

    def ended(_task: asyncio.Task[Any]) -> None:
        timer.cancel()
        closing = loop.create_task(close())
        _LINGERING.add(closing)
        closing.add_done_callback(_LINGERING.discard)

    task.add_done_callback(ended)
