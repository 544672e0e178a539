"""What a fenced aiokafka producer leaves behind: telling fencing apart, and cleaning up.

Kept beside the owner runtime (:mod:`streamsched.kafka.owner`) because both concern aiokafka
0.14's transaction internals, read defensively (a missing attribute is skipped, never raised):

* fencing shows up as ``ProducerFenced``, or wrapped by a caller's error, or only in the
  transaction manager's state (a later call on a fenced producer fails with an unrelated
  ``AssertionError``): :func:`is_fenced` and :func:`producer_fenced` look at all three, because
  a fenced owner must never be restarted (it would fence the real owner back);
* a fenced producer fails every pending future at once and nobody awaits most of them, so
  asyncio would log ``Future exception was never retrieved ... ProducerFenced`` tracebacks at
  garbage collection (defect 4m): :func:`settle_sends` and :func:`settle_producer_futures`
  mark them seen, and the owner's one log line is the only trace.
"""

from __future__ import annotations

import asyncio
from typing import Any

from streamsched.errors import FencedOut


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Done callback: mark a future's exception as seen (it is handled elsewhere)."""
    if not fut.cancelled():
        fut.exception()


def _fenced_error() -> type[BaseException]:
    from aiokafka.errors import ProducerFenced

    return ProducerFenced  # type: ignore[no-any-return]


def is_fenced(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused while handling, a fencing error."""
    fenced = _fenced_error()
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # also when wrapped by the caller's error
        if isinstance(cur, fenced | FencedOut):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def producer_fenced(producer: Any) -> bool:
    """Whether aiokafka's transaction manager of ``producer`` ended fenced (a later call on a
    fenced producer fails with an unrelated ``AssertionError`` about its state)."""
    waiter = getattr(getattr(producer, "_txn_manager", None), "_transaction_waiter", None)
    return (isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled()
            and isinstance(waiter.exception(), _fenced_error()))


def settle_producer_futures(producer: Any) -> BaseException | None:
    """Retrieve the exceptions a fenced aiokafka producer leaves in its transaction futures.

    The transaction waiter, queued offset commits and the batches the dead sender never
    drained are failed together and awaited by nobody once the owner gave up. Returns the first
    exception found (None if none).
    """
    txn = getattr(producer, "_txn_manager", None)
    first: BaseException | None = None
    futures: list[Any] = [getattr(txn, "_transaction_waiter", None), getattr(txn, "_pid_waiter", None)]
    futures += [f for *_, f in getattr(txn, "_pending_txn_offsets", ())]
    # Batches the dead sender never drained keep a failed "drained" waiter nobody awaits.
    acc = getattr(producer, "_message_accumulator", None)
    batches = [b for queue in getattr(acc, "_batches", {}).values() for b in queue]
    batches += list(getattr(acc, "_pending_batches", ()))
    futures += [getattr(b, name, None) for b in batches for name in ("_drain_waiter", "future")]
    for fut in futures:
        if isinstance(fut, asyncio.Future) and fut.done() and not fut.cancelled():
            exc = fut.exception()
            first = first or exc
    return first


def settle_sends(producer: Any) -> None:
    """Mark the result futures of ``producer``'s sends as retrieved once they fail.

    When a fenced producer fails a transaction, every batch future of it fails together; the
    caller awaits them with ``gather``, which raises the first and leaves the rest unretrieved
    (``Future exception was never retrieved`` tracebacks at garbage collection). Whoever awaits
    a future still gets its exception; only the GC-time report is silenced, as the owner logs
    the failure once.
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
