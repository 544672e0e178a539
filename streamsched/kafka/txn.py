"""One transaction of a partition owner, begun, written, committed (or aborted) within a deadline.

Both owners of partitions (the worker's turn, the schedule ticker's tick) write through
:func:`transaction`. Why a deadline: aiokafka 0.14 retries some transactional requests without
end (a coordinator or leader it keeps asking after the cluster moved on; see aio-libs/aiokafka
issue 1145). Without a bound the owner would wait on that producer forever and its partition
would stall with no error anywhere. With it, the transaction fails with
:class:`~streamsched.errors.TransactionStuck`, the owner fails, and its restart (a fresh
producer, whose ``init_transactions`` fences the stuck one) resumes from committed state.

The deadline equals the producers' ``transaction_timeout_ms``: past it the broker has aborted
the transaction anyway, so the commit could only fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from streamsched.errors import TransactionStuck
from streamsched.metrics import Metrics

TXN_DEADLINE_S = 60.0
"""Begin to commit, at most; also the owners' producers' transaction timeout."""
TRANSACTION_TIMEOUT_MS = int(TXN_DEADLINE_S * 1000)
ABORT_DEADLINE_S = 10.0
"""How long an abort may take: a producer that cannot commit may not abort either."""


async def transaction(producer: Any, body: Callable[[], Awaitable[None]], *,
                      deadline_s: float = TXN_DEADLINE_S, on_abort: Callable[[], None] | None = None,
                      metrics: Metrics | None = None, what: str = "a transaction") -> None:
    """Begin, ``await body()`` (the writes), commit. On any failure ``on_abort()`` (drop what
    the caller staged) and a bounded abort, then the failure propagates; past ``deadline_s``
    the failure is :class:`TransactionStuck` (counted as ``stuck_transactions``)."""
    try:
        async with asyncio.timeout(deadline_s) as deadline:
            await producer.begin_transaction()
            try:
                await body()
                await producer.commit_transaction()
            except BaseException:
                if on_abort is not None:
                    on_abort()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.abort_transaction(), ABORT_DEADLINE_S)
                raise
    except TimeoutError as exc:
        if not deadline.expired():
            raise  # the body's own timeout, not ours
        if metrics is not None:
            metrics.inc("stuck_transactions")
        raise TransactionStuck(f"{what} did not commit within {deadline_s:.0f}s") from exc
