"""The one place every aiokafka client of streamsched is built.

Every consumer, producer and admin client the project creates (worker, ticker, catalog, emit,
dlq, status, reads, tests, benchmarks) comes from the factories below, built from one
:class:`Connection`. The safety settings are locked here and cannot be overridden by a caller:

* consumers: ``enable_auto_commit=False`` (offsets only move inside our transactions or after
  durable writes), ``auto_offset_reset="earliest"`` (a new group never skips work),
  ``isolation_level="read_committed"`` (aborted writes of a fenced owner are never seen);
* producers: ``acks="all"`` and ``enable_idempotence=True``; transactional producers also get a
  caller-chosen ``transactional_id`` (one per fenced partition, see :mod:`streamsched.kafka.owner`).

Passing one of the locked options raises :class:`~streamsched.errors.ConfigError`: a tuning
knob must never silently weaken delivery guarantees.

Recovery from leadership changes (defect 4o): aiokafka keeps cluster metadata for
``metadata_max_age_ms`` (300 s by default) and its 0.14 fetcher does not refresh it when an
offset lookup (ListOffsets, sent to reset a position, e.g. a delay partition without a
committed offset) fails with ``NotLeaderForPartitionError``: it retries the stale leader every
100 ms, and while that reset is pending no fetch goes to that node, stalling every other
partition it led (measured: 227 s after a broker was paused for 30 s). So consumers and
producers default to :data:`METADATA_MAX_AGE_MS` (a small MetadataRequest for the client's own
topics every few seconds), and every consumer forces a metadata refresh when an offset lookup
fails (:func:`_refresh_metadata_on_offset_errors`), so it finds the new leader at once.

Typed boundary: aiokafka ships no type information, so the factories return the aiokafka
classes as ``Any``-typed objects behind the small Protocols callers actually use.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from streamsched.errors import ConfigError
from streamsched.model.retry import register_transport_errors

log = logging.getLogger(__name__)

LOCKED_CONSUMER = frozenset({"enable_auto_commit", "auto_offset_reset", "isolation_level"})
LOCKED_PRODUCER = frozenset({"acks", "enable_idempotence", "transactional_id"})
METADATA_MAX_AGE_MS = 5_000
"""Default metadata refresh period of consumers and producers (aiokafka's own is 300 s): a client
whose leader moved recovers within seconds even where aiokafka does not refresh on the error."""
_CONSUMER_DEFAULTS: dict[str, Any] = {"metadata_max_age_ms": METADATA_MAX_AGE_MS}
_PRODUCER_DEFAULTS: dict[str, Any] = {"linger_ms": 1, "metadata_max_age_ms": METADATA_MAX_AGE_MS}


@dataclass(frozen=True)
class Connection:
    """How every client reaches the cluster.

    ``options`` are extra aiokafka client options common to every client (security settings,
    timeouts); the locked safety options above are refused.
    """

    bootstrap: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap or not isinstance(self.bootstrap, str):
            raise ConfigError("no bootstrap servers: pass --bootstrap or set STREAMSCHED_BOOTSTRAP")
        _refuse(self.options, LOCKED_CONSUMER | LOCKED_PRODUCER, "connection")

    def common(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, **self.options}

    def __repr__(self) -> str:
        # Options may hold credentials: never print their values.
        return f"Connection(bootstrap={self.bootstrap!r}, options={sorted(self.options)})"


Conn = Connection | str


def _transport_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

    return (KafkaConnectionError, RequestTimedOutError)


# A handler that talks to Kafka itself and fails in transport is retryable (SPEC §3); loaded
# lazily, so importing this module does not import aiokafka.
register_transport_errors(_transport_errors)


def connection(conn: Conn) -> Connection:
    """``conn`` as a :class:`Connection` (a bare string is the bootstrap list)."""
    return conn if isinstance(conn, Connection) else Connection(conn)


def _refuse(options: dict[str, Any], locked: frozenset[str], what: str) -> None:
    bad = sorted(set(options) & locked)
    if bad:
        raise ConfigError(f"{what} option(s) {', '.join(bad)} are fixed by streamsched for safety "
                          "and cannot be set")


def consumer(conn: Conn, *topics: str, group_id: str | None = None, **options: Any) -> Any:
    """An ``AIOKafkaConsumer`` (not started): no auto commit, earliest, read_committed; it
    refreshes metadata every few seconds and whenever an offset lookup fails (module docs)."""
    _refuse(options, LOCKED_CONSUMER, "consumer")
    c = connection(conn)
    return _consumer_class()(*topics, group_id=group_id, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed",
                             **{**_CONSUMER_DEFAULTS, **c.common(), **options})


@functools.cache
def _consumer_class() -> type[Any]:
    # Built on first use so importing this module does not import aiokafka.
    from aiokafka import AIOKafkaConsumer

    class Consumer(AIOKafkaConsumer):  # type: ignore[misc]
        """``AIOKafkaConsumer`` whose fetcher refreshes metadata when an offset lookup fails."""

        async def start(self) -> None:
            await super().start()
            _refresh_metadata_on_offset_errors(self)

    return Consumer


def _refresh_metadata_on_offset_errors(consumer: Any) -> None:
    """Make a started consumer's fetcher force a metadata update when a ListOffsets fails.

    aiokafka 0.14 (pinned) resets positions in ``Fetcher._update_fetch_positions``, which calls
    ``_proc_offset_request`` and, on any ``KafkaError`` (``NotLeaderForPartitionError`` after a
    leader moved, a timeout to a paused broker), only logs and retries the same node after
    ``retry_backoff_ms``. Wrapping that one call is the narrowest fix: the retry then goes to
    the leader named by fresh metadata. ``_retrieve_offsets`` (``end_offsets`` and friends)
    already refreshes on such errors; a second forced update is coalesced by the client.
    """
    from aiokafka.errors import KafkaError

    fetcher = getattr(consumer, "_fetcher", None)
    original = getattr(fetcher, "_proc_offset_request", None)
    client = getattr(consumer, "_client", None)
    if fetcher is None or original is None or client is None:
        # A different aiokafka: keep working on the short metadata max age alone.
        log.warning("aiokafka fetcher internals changed; offset-lookup failures will not force "
                    "a metadata refresh")
        return

    async def proc_offset_request(node_id: int, topic_data: Any) -> Any:
        try:
            return await original(node_id, topic_data)
        except KafkaError:
            client.force_metadata_update()
            raise

    fetcher._proc_offset_request = proc_offset_request


def producer(conn: Conn, **options: Any) -> Any:
    """An idempotent ``AIOKafkaProducer`` with ``acks="all"`` (not started)."""
    from aiokafka import AIOKafkaProducer

    _refuse(options, LOCKED_PRODUCER, "producer")
    c = connection(conn)
    return AIOKafkaProducer(acks="all", enable_idempotence=True,
                            **{**_PRODUCER_DEFAULTS, **c.common(), **options})


def transactional_producer(conn: Conn, transactional_id: str, **options: Any) -> Any:
    """A transactional producer bound to ``transactional_id`` (its start fences older owners)."""
    from aiokafka import AIOKafkaProducer

    _refuse(options, LOCKED_PRODUCER, "producer")
    if not transactional_id:
        raise ConfigError("a transactional producer needs a transactional id")
    c = connection(conn)
    return AIOKafkaProducer(acks="all", enable_idempotence=True, transactional_id=transactional_id,
                            **{**_PRODUCER_DEFAULTS, **c.common(), **options})


def admin(conn: Conn, **options: Any) -> Any:
    """An ``AIOKafkaAdminClient`` (not started)."""
    from aiokafka.admin import AIOKafkaAdminClient

    c = connection(conn)
    return AIOKafkaAdminClient(**{**c.common(), **options})
