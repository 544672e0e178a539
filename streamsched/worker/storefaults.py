"""What a claim store does when the filesystem refuses its writes.

**A store that cannot be written** (disk full, a read-only or failing filesystem): RocksDB
refuses the write (and every later one: it stops at its first background error). The store is
then *broken* (:attr:`StateBase.broken`, a :class:`~streamsched.errors.StoreUnwritable`), the
gauge ``store_unwritable{partition}`` goes to 1, and it keeps what it could not write in memory
(reads see it), so the partition stops *cleanly*: it takes no new record, resolves and commits
what it has in hand (its executions' outcomes reach the changelog: none runs twice), then its
owner fails with that error (``/status`` shows its type and kind; the worker is not ready). The
checkpoint on disk never moved past what was written, so nothing is lost: the owner restarts with
backoff (:class:`~streamsched.kafka.owner.RestartPolicy`), each restart reopening the store and
catching up from its checkpoint (or cold, from the changelog); a restore that cannot write fails
the same way, and the first one that writes again sets the gauge back to 0.
"""

from __future__ import annotations

from streamsched.errors import StoreUnwritable

_UNWRITABLE = ("io error", "no space left", "read-only", "read only file system", "disk quota")
"""What RocksDB's messages (it raises a bare Exception) say when the filesystem refuses a write."""


def unwritable(exc: BaseException) -> str | None:
    """The one-line reason when ``exc`` is the filesystem refusing the store's writes (RocksDB's
    I/O error or an OSError), else None (a bug, not a storage fault: never masked as one)."""
    if isinstance(exc, StoreUnwritable):
        return exc.reason
    text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
        # rocksdict raises a bare OSError("Read-only file system (os error 30)") opening a store.
        return (exc.strerror or text) + (f": {exc.filename}" if exc.filename else "")
    if type(exc) is Exception and any(marker in text.lower() for marker in _UNWRITABLE):
        return text
    return None
