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

Security (TLS, SASL PLAIN/SCRAM/OAUTHBEARER) and the user's extra client options ride on the
:class:`Connection` (validated in :mod:`streamsched.kafka.security`, built from CLI flags,
``STREAMSCHED_*`` variables and a TOML file by :mod:`streamsched.ops.config`). Precedence when a
client is built: our defaults, then the connection's options, then what the calling module
passes for that client (e.g. the worker's fetch and request sizes): the project's own per-client
choices win over a tuning file.

Recovery from leadership changes (defect 4o): aiokafka keeps cluster metadata for
``metadata_max_age_ms`` (300 s by default) and its 0.14 fetcher does not refresh it when an
offset lookup (ListOffsets, sent to reset a position, e.g. a delay partition without a
committed offset) fails with ``NotLeaderForPartitionError``: it retries the stale leader every
100 ms, and while that reset is pending no fetch goes to that node, stalling every other
partition it led (measured: 227 s after a broker was paused for 30 s). So consumers and
producers default to :data:`METADATA_MAX_AGE_MS` (a small MetadataRequest for the client's own
topics every few seconds), and every consumer forces a metadata refresh when an offset lookup
fails (:func:`_refresh_metadata_on_offset_errors`), so it finds the new leader at once.

Recovery from a stopped broker (docs/failover.md): a broker that stops answering (paused, or
its host gone) keeps aiokafka's requests waiting for their whole ``request_timeout_ms`` and
then retries them on the same node. Every consumer and producer bounds connecting and each
request but JoinGroup/SyncGroup to :data:`REQUEST_BOUND_MS` and forces a metadata refresh when a
request times out or its connection breaks, so the retry after Kafka fenced the broker goes to
the node that took over (:func:`_recover_from_timeouts`).

Broker version: every client, once started, checks the cluster's Kafka release from
its ApiVersions (:func:`verify_broker`, once per process and bootstrap list) and refuses an
untested one with :class:`~streamsched.kafka.version.UntestedKafkaVersion` unless the connection
allows it (``allow_untested_kafka``, or ``STREAMSCHED_ALLOW_UNTESTED_KAFKA=1``).

Typed boundary: aiokafka ships no type information, so the factories return the Protocols of
:mod:`streamsched.kafka.protocols` (the surface the package uses); what aiokafka offers only
through private internals is reached through :mod:`streamsched.kafka.compat`, nowhere else.

Why one module above ~400 lines: "every client is built in one place" is the guarantee; the
connection, the locked options, the version check and the metadata-refresh patch each apply to
every client, so splitting them would give a caller a way to build a client that skips one.
Validation of the security settings already lives in :mod:`streamsched.kafka.security`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamsched.errors import ConfigError
from streamsched.kafka import clientlog, compat, security, version
from streamsched.kafka.protocols import GroupConsumer, Producer, TopicPartitionLike, TransactionalProducer
from streamsched.kafka.security import RegistrySettings, Secret
from streamsched.model.retry import register_transport_errors

log = logging.getLogger(__name__)

LOCKED_CONSUMER = frozenset({"enable_auto_commit", "auto_offset_reset", "isolation_level"})
LOCKED_PRODUCER = frozenset({"acks", "enable_idempotence", "transactional_id"})
METADATA_MAX_AGE_MS = 5_000
"""Default metadata refresh period of consumers and producers (aiokafka's own is 300 s): a client
whose leader moved recovers within seconds even where aiokafka does not refresh on the error."""
REQUEST_BOUND_MS = 5_000
"""How long a consumer or producer waits to connect to a broker or for its answer, except for
JoinGroup/SyncGroup (see :func:`streamsched.kafka.compat.bound_requests`); aiokafka's
``request_timeout_ms`` (40 s by default, the owners' 30 s) still bounds whole calls and those two.

A broker that stops answering (paused, or its host gone) is fenced by Kafka after
``broker.session.timeout.ms`` (9 s by default), which moves its leaderships and coordinators.
aiokafka waited out the whole request timeout on it first: every transaction that touched it
stayed stuck for 30 s, and a consumer's heartbeat (or a connection attempt, made under a lock
all its new connections wait for, or a metadata request) hung long enough for its session to
expire on the coordinator that took over (measured, median of 3: every partition progressed
33.7 s after a broker was paused for 30 s, then a rebalance of every partition; with this bound
15.2 s and no rebalance, see docs/failover.md). With 5 s, the second attempt after the fence goes
to the node that took over."""
UNRESPONSIVE_SKIP_S = 10.0
"""How long every client of the process leaves a broker alone once a request or connection to it
timed out (unless it answers first; :func:`streamsched.kafka.compat.bound_requests`). About
Kafka's ``broker.session.timeout.ms`` (9 s): a broker silent for the whole request bound is by
then fenced and its leaderships and coordinators moved, so the clients' next requests go to the
nodes that took over instead of spending another bound each on the stopped one."""
REFRESH_ON_TIMEOUT_S = 1.0
"""At most one forced metadata refresh per client this often on failed requests."""
_CONSUMER_DEFAULTS: dict[str, Any] = {"metadata_max_age_ms": METADATA_MAX_AGE_MS}
_PRODUCER_DEFAULTS: dict[str, Any] = {"linger_ms": 1, "metadata_max_age_ms": METADATA_MAX_AGE_MS}


@dataclass(frozen=True)
class Connection:
    """How every client reaches and authenticates to the cluster.

    ``options`` are extra aiokafka options for every client (each goes to the clients that take
    it); ``producer_options``, ``consumer_options`` and ``admin_options`` to one kind only. The
    locked safety options (:data:`USER_LOCKED`) are refused, and so are raw security options:
    security goes through the typed fields below, which are validated together and redacted.

    * ``security_protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL;
    * ``sasl_mechanism``: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with ``sasl_username`` and
      ``sasl_password``), or OAUTHBEARER (with ``oauth_token_provider``: a callable returning a
      token, sync or async, or an ``aiokafka.abc.AbstractTokenProvider``);
    * ``ssl_cafile`` (default: the system's CAs), ``ssl_certfile``/``ssl_keyfile`` (a client
      certificate, ``ssl_key_password`` if its key is encrypted) and ``ssl_check_hostname``.

    Passwords are :class:`~streamsched.kafka.security.Secret` (a plain string is wrapped): the
    repr and every error show which settings are set, never a credential.
    """

    bootstrap: str
    options: dict[str, Any] = field(default_factory=dict)
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    oauth_token_provider: Any = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: Secret | None = None
    ssl_check_hostname: bool = True
    producer_options: dict[str, Any] = field(default_factory=dict)
    consumer_options: dict[str, Any] = field(default_factory=dict)
    admin_options: dict[str, Any] = field(default_factory=dict)
    allow_untested_kafka: bool = False
    """Connect to a Kafka release that is not tested (see :mod:`streamsched.kafka.version`)."""
    registry: RegistrySettings | None = None
    """The schema registry of topics in the ``registry`` wire format (:mod:`streamsched.kafka.registry`)."""

    def __post_init__(self) -> None:
        if not self.bootstrap or not isinstance(self.bootstrap, str):
            raise ConfigError("no bootstrap servers: pass --bootstrap or set STREAMSCHED_BOOTSTRAP")
        # Plain strings become Secrets before anything can print them.
        object.__setattr__(self, "sasl_password", security.secret(self.sasl_password))
        object.__setattr__(self, "ssl_key_password", security.secret(self.ssl_key_password))
        object.__setattr__(self, "security_protocol", str(self.security_protocol).upper())
        if self.sasl_mechanism:
            object.__setattr__(self, "sasl_mechanism", str(self.sasl_mechanism).upper())
        security.check(self.security_protocol, self.sasl_mechanism, self.sasl_username, self.sasl_password,
                       self.oauth_token_provider, self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile,
                       self.ssl_key_password)
        kinds = ("consumer", "producer", "admin")
        security.check_options(USER_LOCKED, self.options, "client", kinds)
        security.check_options(USER_LOCKED, self.producer_options, "producer", ("producer",))
        security.check_options(USER_LOCKED, self.consumer_options, "consumer", ("consumer",))
        security.check_options(USER_LOCKED, self.admin_options, "admin", ("admin",))
        if self.uses_tls:
            self.ssl_context()  # a missing or unreadable CA/cert/key is a config error now

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def ssl_context(self) -> Any:
        """The TLS context of this connection's clients (built once)."""
        cached = self.__dict__.get("_ssl_context")
        if cached is None:
            cached = security.ssl_context(self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile,
                                          self.ssl_key_password, self.ssl_check_hostname)
            object.__setattr__(self, "_ssl_context", cached)
        return cached

    def security(self) -> dict[str, Any]:
        """The aiokafka keyword options that authenticate and encrypt (they carry credentials:
        hand them to a client, never to a log)."""
        if self.uses_sasl:
            security.redact_client_logs()  # before any client of this connection can log a login
        opts: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            opts["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            opts["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                provider = self.__dict__.get("_token_provider")
                if provider is None:
                    provider = security.token_provider(self.oauth_token_provider)
                    object.__setattr__(self, "_token_provider", provider)
                opts["sasl_oauth_token_provider"] = provider
            else:
                assert self.sasl_password is not None  # checked in __post_init__
                opts["sasl_plain_username"] = self.sasl_username
                opts["sasl_plain_password"] = self.sasl_password.reveal()
        return opts

    def for_client(self, kind: str) -> dict[str, Any]:
        """Everything this connection gives an aiokafka ``kind`` client (consumer, producer,
        admin): bootstrap, security, the every-client options it takes, then its own options."""
        accepted = security.accepted(kind)
        common = {k: v for k, v in self.options.items() if k in accepted}
        own = {"producer": self.producer_options, "consumer": self.consumer_options,
               "admin": self.admin_options}[kind]
        return {"bootstrap_servers": self.bootstrap, **self.security(), **common, **own}

    def describe(self) -> dict[str, Any]:
        """What may be shown of this connection (logs, errors, status): no credential."""
        out: dict[str, Any] = {"bootstrap": self.bootstrap, "security_protocol": self.security_protocol}
        if self.uses_sasl:
            out["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_username:
                out["sasl_username"] = self.sasl_username
            out["credentials"] = "token provider" if self.sasl_mechanism == "OAUTHBEARER" else "password"
        if self.uses_tls:
            out.update(ssl_cafile=self.ssl_cafile or "system", ssl_check_hostname=self.ssl_check_hostname)
            if self.ssl_certfile:
                out["ssl_certfile"] = self.ssl_certfile
        for name in ("options", "producer_options", "consumer_options", "admin_options"):
            value: dict[str, Any] = getattr(self, name)
            if value:
                out[name] = sorted(value)  # names only: a value may be anything
        if self.allow_untested_kafka:
            out["allow_untested_kafka"] = True
        if self.registry is not None:
            out["registry"] = self.registry.describe()
        return out

    def __repr__(self) -> str:
        # Only what describe() shows: option values and credentials never.
        return "Connection(" + ", ".join(f"{k}={v!r}" for k, v in self.describe().items()) + ")"

    __str__ = __repr__


USER_LOCKED = (LOCKED_CONSUMER | LOCKED_PRODUCER | security.SECURITY_OPTIONS
               | frozenset({"partition_assignment_strategy", "group_id", "group_instance_id",
                            "bootstrap_servers", "key_serializer", "value_serializer",
                            "key_deserializer", "value_deserializer", "partitioner", "topics", "loop"}))
"""Options a connection may not carry: the safety settings (auto commit, offset reset, isolation,
acks, idempotence, transactional id, assignment strategy), what the project itself decides per
client (group, serializers, partitioner) and security (set through the typed fields)."""


Conn = Connection | str


def _transport_errors() -> tuple[type[BaseException], ...]:
    from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

    return (KafkaConnectionError, RequestTimedOutError)


# A handler that talks to Kafka itself and fails in transport is retryable; loaded
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


def consumer(conn: Conn, *topics: str, group_id: str | None = None, **options: Any) -> GroupConsumer:
    """An ``AIOKafkaConsumer`` (not started): no auto commit, earliest, read_committed; it
    refreshes metadata every few seconds and whenever an offset lookup fails (module docs)."""
    _refuse(options, LOCKED_CONSUMER, "consumer")
    if group_id is not None:
        clientlog.group_starting()  # its coordinator lookup may fail routinely for a while
    c = connection(conn)
    built = _consumer_class()(*topics, group_id=group_id, enable_auto_commit=False,
                              auto_offset_reset="earliest", isolation_level="read_committed",
                              **{**_CONSUMER_DEFAULTS, **c.for_client("consumer"), **options})
    built._streamsched_conn = c
    _recover_from_timeouts(built)
    return built  # type: ignore[no-any-return]


async def _closing_on_failure(starting: Awaitable[None], close: Callable[[], Awaitable[None]]) -> None:
    """Await a client's ``start()``; when it fails (Kafka unreachable), close the client before
    the error goes on: callers start a client before their ``try``, so nothing else closes it,
    and aiokafka would print "Unclosed AIOKafkaConsumer" after the one-line error."""
    try:
        await starting
    except BaseException:
        with contextlib.suppress(Exception):
            await close()
        raise


@functools.cache
def _consumer_class() -> type[Any]:
    # Built on first use so importing this module does not import aiokafka.
    from aiokafka import AIOKafkaConsumer

    class Consumer(AIOKafkaConsumer):  # type: ignore[misc]
        """``AIOKafkaConsumer`` whose fetcher refreshes metadata when an offset lookup fails."""

        _streamsched_conn: Connection | None = None

        async def start(self) -> None:
            await _closing_on_failure(super().start(), self.stop)
            _refresh_metadata_on_offset_errors(self)
            await _verify_started(self, compat.client_of(self), self.stop)

        async def stop(self) -> None:
            await compat.stop_consumer(self, super().stop)  # whole, see there

        def position_now(self, partition: TopicPartitionLike) -> int | None:
            """``partition``'s position if the consumer knows it now, else None (not assigned,
            or a reset not answered yet); never waits. ``position()`` waits for a pending reset,
            in aiokafka 0.14 in a loop without end, which must not stop a loop serving every
            other partition (the worker's intake)."""
            return compat.position_now(self, partition)

    return Consumer


@functools.cache
def _producer_class() -> type[Any]:
    from aiokafka import AIOKafkaProducer

    class Producer(AIOKafkaProducer):  # type: ignore[misc]
        """``AIOKafkaProducer`` that checks the broker's release when it starts."""

        _streamsched_conn: Connection | None = None

        async def start(self) -> None:
            await _closing_on_failure(super().start(), self.stop)
            await _verify_started(self, compat.client_of(self), self.stop)

    return Producer


@functools.cache
def _admin_class() -> type[Any]:
    from aiokafka.admin import AIOKafkaAdminClient

    class Admin(AIOKafkaAdminClient):  # type: ignore[misc]
        """``AIOKafkaAdminClient`` that checks the broker's release when it starts."""

        _streamsched_conn: Connection | None = None

        async def start(self) -> None:
            await _closing_on_failure(super().start(), self.close)
            await _verify_started(self, compat.client_of(self), self.close)

    return Admin


_verified: dict[str, version.DetectedVersion] = {}
"""Bootstrap list -> the release its cluster was found to run (checked once per process)."""


async def api_versions(client: Any) -> dict[int, tuple[int, int]] | None:
    """The (min, max) version per API key of one broker of a started aiokafka ``client``
    (``AIOKafkaClient``); None if no broker answers or aiokafka's internals changed."""
    return await compat.broker_api_versions(client)


async def verify_broker(conn: Connection, client: Any) -> version.DetectedVersion | None:
    """Check the release of the cluster ``client`` (a started ``AIOKafkaClient``) reached.

    Raises :class:`~streamsched.kafka.version.UntestedKafkaVersion` for an untested release unless
    ``conn`` (or ``STREAMSCHED_ALLOW_UNTESTED_KAFKA``) allows it; an allowed one is logged once.
    """
    known = _verified.get(conn.bootstrap)
    if known is None:
        versions = await api_versions(client)
        if versions is None:
            log.warning("could not read the API versions of %s; its Kafka release is not checked",
                        conn.bootstrap)
            return None
        known = version.detect(versions)
    allowed = conn.allow_untested_kafka or version.allowed_by_env()
    version.refuse_untested(conn.bootstrap, known, allow_untested=allowed)
    if conn.bootstrap not in _verified and not known.tested:
        log.warning("Kafka at %s is %s, not a tested release (tested: %s); connecting as allowed",
                    conn.bootstrap, known.name, version.tested_range())
    _verified[conn.bootstrap] = known
    return known


async def _verify_started(client_obj: Any, client: Any, close: Callable[[], Awaitable[None]]) -> None:
    clientlog.connected()  # started: it reached a bootstrap address
    conn: Connection | None = client_obj._streamsched_conn
    if conn is None:
        return
    try:
        await verify_broker(conn, client)
    except version.UntestedKafkaVersion:
        await close()  # the caller's start() raised: it will not stop what it never got
        raise


def _refresh_metadata_on_offset_errors(consumer: object) -> None:
    """Make a started consumer's fetcher force a metadata update when a ListOffsets fails.

    aiokafka 0.14 (pinned) resets positions in ``Fetcher._update_fetch_positions``, which calls
    ``_proc_offset_request`` and, on any ``KafkaError`` (``NotLeaderForPartitionError`` after a
    leader moved, a timeout to a paused broker), only logs and retries the same node after
    ``retry_backoff_ms``. Wrapping that one call is the narrowest fix: the retry then goes to
    the leader named by fresh metadata. ``_retrieve_offsets`` (``end_offsets`` and friends)
    already refreshes on such errors; a second forced update is coalesced by the client.
    """
    client = compat.client_of(consumer)
    # Looked up at each failure, not bound now: the client's method is what a refresh calls.
    if client is None or not compat.on_offset_lookup_error(consumer, lambda: client.force_metadata_update()):
        # A different aiokafka: keep working on the short metadata max age alone.
        log.warning("aiokafka fetcher internals changed; offset-lookup failures will not force "
                    "a metadata refresh")


def _recover_from_timeouts(built: object) -> None:
    """Bound ``built``'s connections and requests to :data:`REQUEST_BOUND_MS` and refresh its
    metadata, at most every :data:`REFRESH_ON_TIMEOUT_S`, when a request times out or its
    connection fails, so the retry goes to the node that took over (aiokafka retries the same
    one until its periodic refresh); a coordinator lookup whose connection closes is retried
    (:func:`streamsched.kafka.compat.retry_lost_lookups`)."""
    client = compat.client_of(built)
    last = [float("-inf")]

    def refresh() -> None:
        now = time.monotonic()
        if now - last[0] >= REFRESH_ON_TIMEOUT_S:
            last[0] = now
            client.force_metadata_update()

    if client is None or not compat.bound_requests(client, REQUEST_BOUND_MS / 1000, refresh,
                                                   skip_s=UNRESPONSIVE_SKIP_S):
        log.warning("aiokafka client internals changed; requests to a broker that stopped "
                    "answering wait for the whole request timeout")
    if client is None or not compat.retry_lost_lookups(client):
        log.warning("aiokafka client internals changed; a coordinator lookup whose connection "
                    "closes may stop a producer")


def producer(conn: Conn, **options: Any) -> Producer:
    """An idempotent ``AIOKafkaProducer`` with ``acks="all"`` (not started)."""
    return _built_producer(conn, options)  # type: ignore[no-any-return]


def transactional_producer(conn: Conn, transactional_id: str, **options: Any) -> TransactionalProducer:
    """A transactional producer bound to ``transactional_id`` (its start fences older owners)."""
    if not transactional_id:
        raise ConfigError("a transactional producer needs a transactional id")
    clientlog.install()  # KIP-890's routine produce retries: one line a minute, not hundreds
    return _built_producer(conn, options, transactional_id=transactional_id)  # type: ignore[no-any-return]


def _built_producer(conn: Conn, options: dict[str, Any], **fixed: Any) -> Any:
    _refuse(options, LOCKED_PRODUCER, "producer")
    c = connection(conn)
    built = _producer_class()(acks="all", enable_idempotence=True, **fixed,
                              **{**_PRODUCER_DEFAULTS, **c.for_client("producer"), **options})
    built._streamsched_conn = c
    _recover_from_timeouts(built)
    compat.contain_requeue(built)
    return built


def admin(conn: Conn, **options: Any) -> Any:
    """An ``AIOKafkaAdminClient`` (not started)."""
    c = connection(conn)
    built = _admin_class()(**{**c.for_client("admin"), **options})
    built._streamsched_conn = c
    return built


def forget_topic(producer: object, topic: str, *, keep: str | None = None) -> None:
    """Stop refreshing ``topic`` in ``producer``'s metadata.

    aiokafka keeps every topic it was ever asked about (``partitions_for``, a send) and asks for
    it again every :data:`METADATA_MAX_AGE_MS`, logging an ERROR each time for a topic this
    principal may not describe. A caller that found a topic unusable and will look it up again
    later itself (the ticker's targets) drops it here. aiokafka 0.14 has no public call for this:
    its client's topic set is replaced (:func:`streamsched.kafka.compat.forget_topic`); ``keep``
    (a topic the caller writes anyway) takes the place of a last topic, as an empty set would
    mean "every topic". A port of a shared producer (``metadata_owner``) forgets it there.
    """
    owner = getattr(producer, "metadata_owner", producer)
    if owner is not None:
        compat.forget_topic(owner, topic, keep=keep)
