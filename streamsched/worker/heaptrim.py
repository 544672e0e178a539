"""Handing the heap that closed claim stores leave behind back to the operating system.

A worker opens a RocksDB store for each partition it takes over and closes it when the partition
moves on (a rebalance, a restarted peer). RocksDB allocates through glibc's malloc from the
arenas of the threads that run it; what a closed store frees stays in those arenas, in pieces
too scattered for glibc to give back on its own, so every takeover left the worker's RSS higher
for good. Measured on this machine (Python 3.11, rocksdict, the stores' own options): twelve
cycles of opening three stores, writing 3,000 claims to each, reading and closing them grew RSS
from 45.6 MB to 65.5 MB; with ``malloc_trim(0)`` after each cycle it stayed at 47.0 MB
(``MALLOC_ARENA_MAX=2`` alone changed nothing: 65.8 MB). In the soak, each worker takeover added
2-4 MB that never came back.

So a store's close asks for one trim a moment later (closes come in bursts: a revocation closes
every store of the partitions it takes away), run on a thread because it walks every arena.
``malloc_trim`` is glibc's; elsewhere (musl, macOS) this does nothing. No library offers it:
a ctypes call is all it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

DELAY_S = 1.0
"""How long after the last close in a burst the trim runs."""


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: libc is among them, no lookup needed
    except OSError:
        return None
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn  # type: ignore[no-any-return]


_TRIM = _malloc_trim()
_pending: asyncio.TimerHandle | None = None
"""The trim a burst of closes is waiting for (one per process: a process runs one loop)."""
trims = 0
"""Trims run in this process (for tests and the curious)."""


def available() -> bool:
    """Whether this C library can trim its heap (glibc)."""
    return _TRIM is not None


def trim() -> bool:
    """Return the free heap of every arena to the operating system now; whether anything was
    released. Safe from any thread."""
    global trims
    if _TRIM is None:
        return False
    trims += 1
    return bool(_TRIM(0))


def trim_soon(delay_s: float = DELAY_S) -> None:
    """Trim ``delay_s`` after the last call of a burst, on the loop's default executor; at once
    (on this thread) without a running loop."""
    if _TRIM is None:
        return
    global _pending
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        trim()
        return
    if _pending is not None:
        _pending.cancel()

    def run() -> None:
        global _pending
        _pending = None
        # RuntimeError: the loop is shutting its executor down, nothing left to trim for.
        with contextlib.suppress(RuntimeError):
            loop.run_in_executor(None, trim).add_done_callback(_logged)

    _pending = loop.call_later(delay_s, run)


def _logged(fut: asyncio.Future[bool]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("heap trim failed: %s", type(fut.exception()).__name__)
