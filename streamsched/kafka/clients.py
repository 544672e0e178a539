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

Typed boundary: aiokafka ships no type information, so the factories return the aiokafka
classes as ``Any``-typed objects behind the small Protocols callers actually use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamsched.errors import ConfigError

LOCKED_CONSUMER = frozenset({"enable_auto_commit", "auto_offset_reset", "isolation_level"})
LOCKED_PRODUCER = frozenset({"acks", "enable_idempotence", "transactional_id"})
_PRODUCER_DEFAULTS: dict[str, Any] = {"linger_ms": 1}


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


def connection(conn: Conn) -> Connection:
    """``conn`` as a :class:`Connection` (a bare string is the bootstrap list)."""
    return conn if isinstance(conn, Connection) else Connection(conn)


def _refuse(options: dict[str, Any], locked: frozenset[str], what: str) -> None:
    bad = sorted(set(options) & locked)
    if bad:
        raise ConfigError(f"{what} option(s) {', '.join(bad)} are fixed by streamsched for safety "
                          "and cannot be set")


def consumer(conn: Conn, *topics: str, group_id: str | None = None, **options: Any) -> Any:
    """An ``AIOKafkaConsumer`` (not started): no auto commit, earliest, read_committed."""
    from aiokafka import AIOKafkaConsumer

    _refuse(options, LOCKED_CONSUMER, "consumer")
    c = connection(conn)
    return AIOKafkaConsumer(*topics, group_id=group_id, enable_auto_commit=False,
                            auto_offset_reset="earliest", isolation_level="read_committed",
                            **{**c.common(), **options})


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
