"""The transactional outbox: ``enqueue`` in the service's transaction, a pull relay to deliver.

A service writes the transitions it wants published into an outbox table **in its own database
transaction**, beside its business rows: both commit or neither does, so no event is published
for a change that rolled back and no committed change loses its event. A relay then pulls due
intents, delivers each (by default: publishes it to Kafka with :class:`~streamsched.kafka.producer.
Producer`, acks=all), and deletes it on success.

Delivery is **at-least-once**: a relay that dies after the send and before the ack leaves the
intent leased; when the lease expires another relay (or the restarted one) delivers it again.
Every delivery of one intent carries the same event (same ``event_id``, same tenant, target and
due time), so the scheduler resolves the same business identity and runs its effect once; other
destinations get the same :attr:`Intent.idempotency_key` every time.

Leases, not heartbeats: a claim leases an intent for ``lease_s``; ``deliver`` must finish within
the lease (it is cancelled past it, and the attempt counts as a ``timeout`` failure), so at most
one relay delivers an intent at a time as long as the clocks that measure the lease agree (the
database's clock on PostgreSQL, the host's on SQLite). Nothing extends a lease while ``deliver``
runs: a delivery that may outlive it should be split, not kept alive.

Failures are retried with :func:`~streamsched.model.retry.compute_backoff` (the outbox's
:class:`~streamsched.model.retry.RetryPolicy`) and the same idempotency key. A failure of kind
``handler_terminal`` (:class:`~streamsched.model.retry.Terminal`), ``decode`` or ``bound`` is
permanent: the intent is marked dead at once. Any other failure is retried, including errors of
unknown type (kind ``internal``): the relay cannot tell whether an unknown error left anything
behind, a retry with the same key is safe, and the attempts bound caps it. After
``policy.maximum_attempts`` deliveries the intent is marked dead with the kind of its last failure
(``lease_expired`` when the last attempt never reported back, e.g. the relay crashed). Dead
intents stay in the table, are counted by kind (:meth:`Outbox.counts`) and never claimed again
until :meth:`Outbox.requeue_dead`.

Database calls are synchronous DB-API calls: ``enqueue`` runs on the caller's connection, inside
the caller's transaction; the relay's own connection (one per :class:`Outbox`, opened from the
DSN, in autocommit mode with explicit write transactions) is driven from asyncio through
:func:`asyncio.to_thread`, one call at a time. One code path serves both backends and the event
loop never blocks on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from streamsched import failpoints, tracing
from streamsched.errors import ConfigError
from streamsched.kafka.clients import Conn
from streamsched.kafka.producer import encode_event
from streamsched.metrics import Metrics
from streamsched.model import limits
from streamsched.model.event import TransitionEvent
from streamsched.model.names import validate_name
from streamsched.model.retry import RetryPolicy, normalize_failure
from streamsched.outbox import kept, sql
from streamsched.outbox.sql import Counts, DbConnection, Intent

if TYPE_CHECKING:
    from streamsched.kafka.admin import TopicSpec

log = logging.getLogger("streamsched.outbox")

Deliver = Callable[[Intent], Awaitable[object]]
"""Delivers one intent; returns on success, raises on failure (see the module docstring)."""

DEFAULT_TABLE = "streamsched_outbox"
MIN_LEASE_S = 1.0
MAX_BATCH = 64
"""Most intents one relay round claims (and delivers concurrently)."""
IDLE_MIN_S = 0.05
MAX_IDLE_S = limits.MAX_SELECTION_WAIT_S
PERMANENT_KINDS = frozenset({"handler_terminal", "decode", "bound"})
"""Failure kinds no retry can fix: the intent is marked dead at once."""
FAILPOINT_AFTER_SEND = "outbox_after_send"
_COUNTS_EVERY_S = 10.0
MAX_KEEP_DELIVERED_S = 7 * 86400.0
"""The longest a relay keeps delivered intents for a re-send (a week)."""
_T = TypeVar("_T")


def _in_write(d: sql.Dialect, conn: DbConnection, op: Callable[[], None]) -> None:
    with d.write(conn):
        op()


class Outbox:
    """An outbox table: ``enqueue`` (service side) and ``run_once``/``relay`` (relay side).

    ``dsn`` (``sqlite:///path.db``, ``sqlite:////abs/path.db`` or ``postgresql://...``) is only
    used by the relay side, which opens its own connection; ``connect`` may replace it (a
    zero-argument function returning a new sqlite3 or psycopg connection). ``lease_s`` bounds one
    delivery; ``batch_size`` how many intents a :meth:`relay` round claims and delivers
    concurrently; ``idle_max_s`` the longest pause between polls of an empty outbox.
    """

    def __init__(self, dsn: str | None = None, *, table: str = DEFAULT_TABLE,
                 policy: RetryPolicy | None = None, lease_s: float = 30.0, batch_size: int = 16,
                 idle_max_s: float = 1.0, connect: Callable[[], DbConnection] | None = None,
                 keep_delivered_s: float = 0.0) -> None:
        self.table = sql.check_table(table)
        self.policy = policy if policy is not None else RetryPolicy()
        limits.check_range("outbox lease_s", lease_s, MIN_LEASE_S, limits.MAX_CLAIM_DURATION_S)
        if type(batch_size) is not int:
            raise ConfigError("outbox batch_size must be an integer")
        limits.check_range("outbox batch_size", batch_size, 1, MAX_BATCH)
        limits.check_range("outbox idle_max_s", idle_max_s, IDLE_MIN_S, MAX_IDLE_S)
        limits.check_range("outbox keep_delivered_s", keep_delivered_s, 0.0, MAX_KEEP_DELIVERED_S)
        if dsn is not None and connect is None:
            sql.check_dsn(dsn)
        self.dsn = dsn
        self.lease_s = float(lease_s)
        self.batch_size = batch_size
        self.idle_max_s = float(idle_max_s)
        self.keep_delivered_s = float(keep_delivered_s)
        self._connect = connect
        self._conn: DbConnection | None = None
        self._dialect: sql.Dialect | None = None
        self._lock = threading.Lock()
        self.metrics = Metrics(f"outbox.{self.table}")
        self._counts_at = 0.0
        self._creating = False
        self._kept_ready = False

    # ------------------------------------------------------------------------- service side

    def create_schema(self, conn: DbConnection) -> None:
        """Create the table and its index if missing (idempotent), in ``conn``'s transaction."""
        sql.create_schema(conn, self.table)

    def enqueue(self, conn: DbConnection, topic: str, event: TransitionEvent) -> int:
        """Record the intent to publish ``event`` to ``topic``, inside ``conn``'s open transaction.

        Validates exactly as the producer does: the topic name, the encoded transition (anything a
        scheduler would dead-letter raises :class:`~streamsched.errors.DecodeError`) and the route
        key bounds (:class:`~streamsched.errors.InvalidName` / ``BoundExceeded``). Nothing is
        written when it raises. The caller commits (or rolls back) its transaction; a rollback
        leaves no intent. Returns the intent's id.
        """
        validate_name(topic, "topic")
        key, value = encode_event(event)  # the Producer's own validation, byte for byte
        # The service's trace (if an OpenTelemetry SDK records one) travels with the intent.
        traceparent = next((v.decode("ascii") for k, v in tracing.inject() if k == "traceparent"), None)
        return sql.insert(conn, self.table, topic, event.event_id, key, value, traceparent)

    # --------------------------------------------------------------------------- relay side

    async def ensure_schema(self) -> None:
        """:meth:`create_schema` on the relay's own connection (committed at once); the only
        call that creates a missing SQLite file (any other refuses a missing file or table)."""
        self._creating = True
        try:
            await self._db(lambda conn, d: sql.create_schema(conn, self.table))
        finally:
            self._creating = False

    async def claim(self, worker_id: str, limit: int = 1) -> list[Intent]:
        """Lease up to ``limit`` due intents to ``worker_id`` (the pull behind :meth:`run_once`)."""
        claimed, _ = await self._claim(worker_id, limit)
        return claimed

    async def ack(self, intents: list[Intent]) -> int:
        """Delete delivered intents (keeping a copy for ``keep_delivered_s``); how many were still there."""
        keep_ns = int(self.keep_delivered_s * 1e9)
        if keep_ns and not self._kept_ready:
            # An outbox table made before kept intents existed gains their table here, once; only
            # when it is missing (creating needs rights a relay's role may not have on PostgreSQL).
            if not await self._db(lambda conn, d: kept.exists(conn, d, self.table)):
                await self._db(lambda conn, d: _in_write(d, conn, lambda: kept.create(conn, d, self.table)))
            self._kept_ready = True
        return await self._db(lambda conn, d: sql.ack(conn, d, self.table, [i.id for i in intents], keep_ns))

    async def resend(self, since_ns: int, *, topic: str | None = None) -> kept.Resent:
        """Send again the intents delivered at or after ``since_ns`` (UTC ns; to ``topic``, or to
        any), as kept by a relay with ``keep_delivered_s``: they become intents due now, with
        their event ids (idempotency keys) and bytes unchanged. ``oldest_kept_ns`` of the result
        after ``since_ns`` means the window did not reach back that far."""
        if topic is not None:
            validate_name(topic, "topic")
        if not await self._db(lambda conn, d: kept.exists(conn, d, self.table)):
            return kept.Resent(0, None)
        return await self._db(lambda conn, d: kept.resend(conn, d, self.table, since_ns, topic))

    async def kept_count(self) -> int:
        """How many delivered intents are kept for a re-send."""
        return await self._db(lambda conn, d: kept.count(conn, d, self.table))

    async def fail(self, intent: Intent, exc: BaseException) -> str:
        """Record a failed delivery: ``"retry"`` (due again after a backoff), ``"dead"``, or
        ``"lost"`` when this relay no longer held the lease (another relay claimed it since)."""
        rec = normalize_failure(exc, attempt=intent.attempt, policy=self.policy, now_ns=time.time_ns())
        kind = rec.cause_kind
        retry = kind not in PERMANENT_KINDS and intent.attempt < self.policy.maximum_attempts
        if retry:
            delay_ns = int(self.policy.delay(intent.attempt) * 1e9)
            done = await self._db(lambda conn, d: sql.reschedule(conn, d, self.table, intent, delay_ns, kind))
        else:
            done = await self._db(lambda conn, d: sql.bury(conn, d, self.table, intent, kind))
        # Ids, attempts and kinds only: the error's message may quote the payload.
        log.warning("outbox %s: intent %d attempt %d failed (%s, %s): %s", self.table, intent.id,
                    intent.attempt, kind, rec.error_type,
                    ("retry" if retry else "dead") if done else "lease lost")
        if not done:
            self.metrics.inc("outbox_lease_lost")
            return "lost"
        self.metrics.inc("outbox_retries" if retry else "outbox_dead", kind=kind)
        return "retry" if retry else "dead"

    async def counts(self) -> Counts:
        """Pending, leased and dead intents (dead by kind), read on the relay's connection."""
        return await self._db(lambda conn, d: sql.counts(conn, d, self.table))

    async def requeue_dead(self, kind: str | None = None) -> int:
        """Make dead intents (of ``kind``, or all) due now with a fresh set of attempts."""
        return await self._db(lambda conn, d: sql.requeue_dead(conn, d, self.table, kind))

    async def run_once(self, worker_id: str, deliver: Deliver) -> bool:
        """Claim one due intent, ``await deliver(intent)``, ack on success, record the failure
        otherwise. True when it claimed (or buried) an intent, False when none was due."""
        return await self._round(worker_id, deliver, 1) > 0

    async def relay(self, worker_id: str, stop: asyncio.Event, deliver: Deliver | None = None, *,
                    kafka: Conn | None = None, topics: Iterable[TopicSpec] = ()) -> None:
        """Deliver intents until ``stop`` is set: rounds of up to ``batch_size`` claims, delivered
        concurrently; an empty round backs off (doubling up to ``idle_max_s``). Without
        ``deliver`` it publishes to Kafka through ``kafka`` (a bootstrap string or
        :class:`~streamsched.kafka.clients.Connection`), each intent in the wire format its
        topic's definition in ``topics`` names (the envelope for a topic without one; see
        :mod:`streamsched.outbox.deliver`). Database errors are counted and retried; they never
        end the loop."""
        _check_worker(worker_id)
        if self._connect is None:
            self._need_dsn()  # a configuration error ends the relay; database errors do not
        if deliver is not None:
            await self._loop(worker_id, stop, deliver)
            return
        if kafka is None:
            raise ConfigError("relay needs a deliver function or a Kafka connection (kafka=...)")
        from streamsched.outbox.deliver import KafkaDelivery

        async with KafkaDelivery(kafka, topics=topics) as to_kafka:
            await self._loop(worker_id, stop, to_kafka)

    def close(self) -> None:
        """Close the relay's connection (it reopens on the next call)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.close)

    # ----------------------------------------------------------------------------- internals

    async def _loop(self, worker_id: str, stop: asyncio.Event, deliver: Deliver) -> None:
        idle = IDLE_MIN_S
        while not stop.is_set():
            try:
                done = await self._round(worker_id, deliver, self.batch_size)
                if not done:
                    await self._refresh_gauges()
            except Exception as exc:  # noqa: BLE001 - counted and retried: the relay outlives a DB outage
                done = 0
                self.metrics.error(exc)
                self.metrics.inc("outbox_relay_errors", kind=_kind(exc))
                log.warning("outbox %s: relay round failed (%s); retrying", self.table, type(exc).__name__)
                idle = self.idle_max_s
            if done:
                idle = IDLE_MIN_S
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), idle)
            idle = min(idle * 2, self.idle_max_s)

    async def _round(self, worker_id: str, deliver: Deliver, limit: int) -> int:
        started = time.monotonic()
        claimed, buried = await self._claim(worker_id, limit)
        if not claimed:
            return buried
        # Cancel a delivery before its lease can expire (measured from before the claim, so
        # the deadline falls inside the lease): past it another relay may claim the intent.
        deadline = started + self.lease_s - min(1.0, self.lease_s / 10)
        results = await asyncio.gather(*(self._deliver(i, deliver, deadline) for i in claimed))
        delivered = [i for i, exc in zip(claimed, results, strict=True) if exc is None]
        if delivered:
            await self.ack(delivered)
            self.metrics.inc("outbox_delivered", len(delivered))
        for intent, exc in zip(claimed, results, strict=True):
            if exc is not None:
                await self.fail(intent, exc)
        return len(claimed) + buried

    async def _deliver(self, intent: Intent, deliver: Deliver, deadline: float) -> BaseException | None:
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(deliver(intent), max(deadline - t0, 0.001))
        except asyncio.CancelledError:
            raise  # the relay is stopping: the lease expires and the intent is delivered again
        except Exception as exc:  # noqa: BLE001 - every delivery failure is recorded by fail()
            return exc
        self.metrics.observe("outbox_deliver_seconds", time.monotonic() - t0)
        # Crash-test boundary: sent, not yet acked (the intent must be delivered again).
        failpoints.hit(FAILPOINT_AFTER_SEND)
        return None

    async def _claim(self, worker_id: str, limit: int) -> tuple[list[Intent], int]:
        _check_worker(worker_id)
        limits.check_range("outbox claim limit", limit, 1, MAX_BATCH)
        lease_ns = int(self.lease_s * 1e9)
        claimed, buried = await self._db(lambda conn, d: sql.claim(
            conn, d, self.table, worker_id, limit, lease_ns, self.policy.maximum_attempts))
        if claimed:
            self.metrics.inc("outbox_claimed", len(claimed))
        if buried:
            self.metrics.inc("outbox_dead", buried, kind="lease_expired")
        return claimed, buried

    async def _refresh_gauges(self) -> None:
        if time.monotonic() - self._counts_at < _COUNTS_EVERY_S:
            return
        self._counts_at = time.monotonic()
        c = await self.counts()
        self.metrics.set_gauge("outbox_pending", c.pending)
        self.metrics.set_gauge("outbox_leased", c.leased)
        self.metrics.set_gauge("outbox_dead_intents", c.dead)

    async def _db(self, op: Callable[[DbConnection, sql.Dialect], _T]) -> _T:
        return await asyncio.to_thread(self._db_sync, op)

    def _db_sync(self, op: Callable[[DbConnection, sql.Dialect], _T]) -> _T:
        with self._lock:
            if self._conn is None:
                if self._connect is not None:
                    conn = self._connect()
                else:
                    dsn = self._need_dsn()
                    # A missing file or table is an error of this call, not a new empty file:
                    # status and requeue say so; the relay counts it and retries until the
                    # service has created its table.
                    conn = sql.open_dsn(dsn, create=self._creating)
                    if not self._creating:
                        try:
                            sql.require_table(conn, self.table, dsn)
                        except BaseException:
                            conn.close()
                            raise
                self._dialect = sql.relay_mode(conn)
                self._conn = conn
            assert self._dialect is not None
            try:
                return op(self._conn, self._dialect)
            except Exception:
                if sql.is_broken(self._conn):
                    # Reconnect on the next call; the error itself propagates to the caller.
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                raise

    def _need_dsn(self) -> str:
        if self.dsn is None:
            raise ConfigError("this Outbox has no dsn (or connect) for the relay's own connection")
        return self.dsn


def _check_worker(worker_id: str) -> None:
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= limits.MAX_NAME_LENGTH:
        raise ConfigError(f"outbox worker_id must be a non-empty string of at most "
                          f"{limits.MAX_NAME_LENGTH} characters")


def _kind(exc: BaseException) -> str:
    if isinstance(exc, sqlite3.Error):
        return "sqlite"
    return "database" if type(exc).__module__.split(".")[0] == "psycopg" else "internal"
