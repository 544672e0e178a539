"""The outbox table and its statements, on SQLite and on PostgreSQL (synchronous DB-API calls).

One table per outbox (default ``streamsched_outbox``); times are UTC nanoseconds since the epoch:

============== ==================================================================================
id             intent id, never reused (SQLite ``AUTOINCREMENT``, PostgreSQL identity)
topic          the Kafka topic the event goes to
event_id       the event's own id: the destination idempotency key (see ``Intent``)
key            the event's route key (``streamsched.model.identity.route_key``)
value          the encoded transition (``streamsched.wire.transition.encode_transition``)
created_ns     when the service enqueued it
due_ns         when it may next be claimed: enqueue time, then lease expiry while claimed, then
               the retry time after a failure. "Claimable" is just ``due_ns <= now``, so an
               expired lease needs no sweeper
attempts       deliveries started (a claim counts one); also the claim's fence: a relay may only
               reschedule or bury the intent while ``attempts`` still equals the one it claimed
lease_owner    worker id of the relay holding (or that last held) the lease
lease_until_ns lease expiry (NULL when not leased)
dead_at_ns     when it was given up (NULL while live); dead intents are never claimed
last_error_kind the normalized cause of the latest failure (a kind such as ``transport``, never a
               message, which could carry payload)
traceparent    the W3C trace context of the service's span when it enqueued (NULL without an
               OpenTelemetry SDK): the relay's send continues that trace. Added to an older
               table by :func:`create_schema`
============== ==================================================================================

A delivered intent is **deleted** on ack: the topic is the durable record of what was
published, so the table holds only the backlog and the dead, and the claim index stays small.
With a keep window, a copy goes to ``<table>_sent`` first (:mod:`streamsched.outbox.kept`).

SQLite claims inside ``BEGIN IMMEDIATE`` (the database write lock, so two relays never select
the same row); PostgreSQL with ``SELECT ... FOR UPDATE SKIP LOCKED`` (relays claim disjoint rows
without waiting for each other) and the database's clock, so relays on hosts with skewed clocks
agree on lease expiry. SQLite relays share one machine's clock.
"""

from __future__ import annotations

import inspect
import os
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from streamsched.errors import ConfigError
from streamsched.outbox import kept

DbConnection = Any
"""A DB-API connection: ``sqlite3.Connection`` or ``psycopg.Connection`` (typed loosely: psycopg
types its queries as literal strings, and ours carry the configured table name)."""

TABLE = re.compile(r"[a-z_][a-z0-9_]{0,47}", re.ASCII)
"""Grammar of an outbox table name (it is spliced into SQL, so nothing else is accepted)."""

_PG_NOW = "(extract(epoch from clock_timestamp()) * 1000000000)::bigint"
_COLUMNS = ("id, topic, event_id, key, value, created_ns, attempts, lease_owner, lease_until_ns, "
            "last_error_kind, traceparent")


def check_table(table: str) -> str:
    if not isinstance(table, str) or not TABLE.fullmatch(table):
        raise ConfigError("outbox table name must match [a-z_][a-z0-9_]{0,47}")
    return table


@dataclass(frozen=True, slots=True)
class Intent:
    """One claimed intent, as a relay's ``deliver`` sees it.

    ``attempt`` is this delivery's number (1 for the first); ``idempotency_key`` (the event's
    ``event_id``) is the same for every attempt, every relay and every crash-restart, so an
    idempotent destination applies the intent once. ``id`` is the row's id in this table.
    """

    id: int
    topic: str
    event_id: str
    key: bytes
    value: bytes
    created_ns: int
    attempt: int
    lease_owner: str
    lease_until_ns: int
    last_error_kind: str | None = None
    traceparent: str | None = None
    """The trace the intent was enqueued under (see the table's columns)."""

    @property
    def idempotency_key(self) -> str:
        return self.event_id

    def __repr__(self) -> str:
        # Never print the value (payload) or the key.
        return f"Intent(id={self.id}, topic={self.topic!r}, attempt={self.attempt})"


@dataclass(frozen=True, slots=True)
class Counts:
    """How many intents are waiting (``pending``: claimable now or later), leased, and dead."""

    pending: int
    leased: int
    dead: int
    dead_by_kind: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"pending": self.pending, "leased": self.leased, "dead": self.dead,
                "dead_by_kind": dict(self.dead_by_kind)}


class Dialect:
    """What differs between the two databases: types, placeholders, clock, write transactions."""

    name = "sqlite"
    blob = "BLOB"
    id_column = "id INTEGER PRIMARY KEY AUTOINCREMENT"
    lock_rows = ""

    def q(self, sql: str) -> str:
        """``sql`` with this driver's placeholders (statements are written with ``?``)."""
        return sql

    def now_ns(self, conn: DbConnection) -> int:
        return time.time_ns()

    def insert_now(self, now: int) -> tuple[str, list[object]]:
        """The SQL of "now" in an INSERT, and its parameters."""
        return "?", [now]

    def table_exists(self, conn: DbConnection, name: str) -> bool:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            [name]).fetchone() is not None

    @contextmanager
    def write(self, conn: DbConnection) -> Iterator[None]:
        """A write transaction on the relay's own connection (opened in autocommit mode)."""
        # IMMEDIATE takes the write lock up front: the SELECT that picks rows and the UPDATE that
        # leases them see one state, and a second relay waits (busy timeout) instead of failing.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


class PostgresDialect(Dialect):
    name = "postgresql"
    blob = "BYTEA"
    id_column = "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    lock_rows = " FOR UPDATE SKIP LOCKED"

    def q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def now_ns(self, conn: DbConnection) -> int:
        return int(conn.execute(f"SELECT {_PG_NOW}").fetchone()[0])

    def insert_now(self, now: int) -> tuple[str, list[object]]:
        return _PG_NOW, []

    def table_exists(self, conn: DbConnection, name: str) -> bool:
        row = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()  # needs no privilege
        return bool(row and row[0] is not None)

    @contextmanager
    def write(self, conn: DbConnection) -> Iterator[None]:
        with conn.transaction():
            yield


SQLITE = Dialect()
POSTGRES = PostgresDialect()


def dialect_of(conn: DbConnection) -> Dialect:
    """The dialect of a caller's connection (sqlite3 or psycopg 3)."""
    if isinstance(conn, sqlite3.Connection):
        return SQLITE
    if type(conn).__module__.split(".")[0] == "psycopg":
        if inspect.iscoroutinefunction(getattr(conn, "execute", None)):
            raise ConfigError("the outbox needs a synchronous psycopg.Connection, not an AsyncConnection")
        return POSTGRES
    raise ConfigError(f"the outbox needs a sqlite3 or psycopg connection, not {type(conn).__name__}")


def check_dsn(dsn: str) -> str:
    """``dsn`` if it names a backend: ``sqlite:///rel.db``, ``sqlite:////abs.db``, ``postgresql://``."""
    if not isinstance(dsn, str) or not dsn.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError("outbox dsn must start with sqlite:/// or postgresql://")
    if dsn.startswith("sqlite:///") and not dsn[len("sqlite:///"):]:
        raise ConfigError("outbox dsn sqlite:/// needs a file path")
    return dsn


def open_dsn(dsn: str, *, create: bool = True) -> DbConnection:
    """A new relay connection for ``dsn`` (psycopg is imported only for PostgreSQL). Without
    ``create`` a SQLite file that does not exist is a :class:`ConfigError` and is not created
    (sqlite3 would create an empty file for any mistyped path)."""
    check_dsn(dsn)
    if dsn.startswith("sqlite:///"):
        path = dsn[len("sqlite:///"):]
        if not create and not os.path.exists(path):
            raise ConfigError(f"outbox database {path} does not exist: run `streamsched outbox relay "
                              "--create-schema` (or Outbox.ensure_schema) to create it and its table")
        # check_same_thread=False: the relay calls it from asyncio.to_thread's worker threads,
        # one call at a time (the Outbox's lock); timeout: how long to wait for the write lock.
        # mode=rw: an existing file only, never a new one, unless creating.
        target = path if create else f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=rw"
        return sqlite3.connect(target, timeout=30, check_same_thread=False, isolation_level=None,
                               uri=not create)
    try:
        import psycopg
    except ImportError:
        raise ConfigError("a PostgreSQL outbox needs psycopg: pip install 'streamsched[postgres]'") from None
    return psycopg.connect(dsn, autocommit=True)


def require_table(conn: DbConnection, table: str, dsn: str) -> None:
    """A :class:`ConfigError` when ``table`` does not exist: status, requeue and a relay started
    without ``--create-schema`` say so instead of failing on a missing table (exit 4)."""
    t = check_table(table)
    d = dialect_of(conn)
    # Not the PostgreSQL DSN: it may carry a password.
    where = dsn[len("sqlite:///"):] if d is SQLITE else "the PostgreSQL database"
    if not d.table_exists(conn, t):
        raise ConfigError(f"outbox table {t} does not exist in {where}: run `streamsched outbox relay "
                          "--create-schema` (or Outbox.ensure_schema) to create it")


def relay_mode(conn: DbConnection) -> Dialect:
    """Put a relay connection in autocommit mode (the relay opens its own write transactions:
    a driver-opened transaction around them would never commit) and return its dialect."""
    d = dialect_of(conn)
    if d is SQLITE:
        conn.isolation_level = None
    else:
        conn.autocommit = True
    return d


def is_broken(conn: DbConnection) -> bool:
    """Whether ``conn`` can no longer be used (a PostgreSQL connection that lost its server)."""
    return bool(getattr(conn, "closed", False) or getattr(conn, "broken", False))


def create_schema(conn: DbConnection, table: str) -> None:
    """Create the table and its claim index if missing, in the caller's transaction."""
    d = dialect_of(conn)
    t = check_table(table)
    conn.execute(f"""CREATE TABLE IF NOT EXISTS {t} (
        {d.id_column},
        topic TEXT NOT NULL,
        event_id TEXT NOT NULL,
        key {d.blob} NOT NULL,
        value {d.blob} NOT NULL,
        created_ns BIGINT NOT NULL,
        due_ns BIGINT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_until_ns BIGINT,
        dead_at_ns BIGINT,
        last_error_kind TEXT,
        traceparent TEXT)""")
    # A table made before traces were kept gets the column (NULL for its rows).
    if d is SQLITE:
        present = {str(row[1]) for row in conn.execute(f"PRAGMA table_info({t})").fetchall()}
        if "traceparent" not in present:
            conn.execute(f"ALTER TABLE {t} ADD COLUMN traceparent TEXT")
    else:
        conn.execute(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS traceparent TEXT")
    # The claim reads live rows in due order: a partial index keeps the dead out of its way.
    conn.execute(f"CREATE INDEX IF NOT EXISTS {t}_due ON {t} (due_ns, id) WHERE dead_at_ns IS NULL")
    kept.create(conn, d, t)  # delivered intents kept for a re-send (used with a keep window)


def insert(conn: DbConnection, table: str, topic: str, event_id: str, key: bytes, value: bytes,
           traceparent: str | None = None) -> int:
    """Insert one intent, due now, in the caller's transaction; its id."""
    d = dialect_of(conn)
    now_sql, now_params = d.insert_now(time.time_ns())
    sql = (f"INSERT INTO {check_table(table)} (topic, event_id, key, value, created_ns, due_ns, traceparent) "
           f"VALUES (?, ?, ?, ?, {now_sql}, {now_sql}, ?) RETURNING id")
    # fetchall, not fetchone: a RETURNING statement left unfinished could block the caller's commit.
    params = [topic, event_id, key, value, *now_params, *now_params, traceparent]
    rows = conn.execute(d.q(sql), params).fetchall()
    return int(rows[0][0])


def claim(conn: DbConnection, d: Dialect, table: str, owner: str, limit: int, lease_ns: int,
          max_attempts: int) -> tuple[list[Intent], int]:
    """Lease up to ``limit`` due intents to ``owner``; also bury (kind ``lease_expired``) due
    intents whose last allowed attempt never reported back. Returns (claimed, buried)."""
    t = check_table(table)
    claimed: list[Intent] = []
    buried = 0
    with d.write(conn):
        now = d.now_ns(conn)
        rows = conn.execute(d.q(f"SELECT id, attempts FROM {t} WHERE dead_at_ns IS NULL AND due_ns <= ? "
                                f"ORDER BY due_ns, id LIMIT ?{d.lock_rows}"), [now, limit]).fetchall()
        until = now + lease_ns
        for intent_id, attempts in rows:
            if attempts >= max_attempts:
                conn.execute(d.q(f"UPDATE {t} SET dead_at_ns = ?, last_error_kind = 'lease_expired', "
                                 "lease_until_ns = NULL WHERE id = ?"), [now, intent_id])
                buried += 1
                continue
            row = conn.execute(d.q(
                f"UPDATE {t} SET attempts = attempts + 1, lease_owner = ?, lease_until_ns = ?, due_ns = ? "
                f"WHERE id = ? RETURNING {_COLUMNS}"), [owner, until, until, intent_id]).fetchall()
            claimed.append(_intent(row[0]))
    return claimed, buried


def _intent(row: Sequence[Any]) -> Intent:
    return Intent(id=int(row[0]), topic=str(row[1]), event_id=str(row[2]), key=bytes(row[3]),
                  value=bytes(row[4]), created_ns=int(row[5]), attempt=int(row[6]),
                  lease_owner=str(row[7]), lease_until_ns=int(row[8]), last_error_kind=row[9],
                  traceparent=row[10])


def ack(conn: DbConnection, d: Dialect, table: str, ids: Sequence[int], keep_ns: int = 0) -> int:
    """Delete delivered intents (whoever holds their lease now: delivered is delivered); with
    ``keep_ns``, keep a copy for that long first (:mod:`streamsched.outbox.kept`)."""
    if not ids:
        return 0
    t = check_table(table)
    marks = ", ".join("?" for _ in ids)
    with d.write(conn):
        if keep_ns:
            kept.keep(conn, d, t, ids, d.now_ns(conn), keep_ns)
        cur = conn.execute(d.q(f"DELETE FROM {t} WHERE id IN ({marks})"), list(ids))
        return int(cur.rowcount)


def reschedule(conn: DbConnection, d: Dialect, table: str, intent: Intent, delay_ns: int, kind: str) -> bool:
    """Release ``intent``'s lease and make it due again after ``delay_ns``; False when the lease
    was lost (another relay claimed it since, or it was acked)."""
    t = check_table(table)
    with d.write(conn):
        now = d.now_ns(conn)
        cur = conn.execute(d.q(
            f"UPDATE {t} SET due_ns = ?, lease_until_ns = NULL, last_error_kind = ? "
            "WHERE id = ? AND attempts = ? AND lease_owner = ? AND dead_at_ns IS NULL"),
            [now + delay_ns, kind, intent.id, intent.attempt, intent.lease_owner])
        return int(cur.rowcount) == 1


def bury(conn: DbConnection, d: Dialect, table: str, intent: Intent, kind: str) -> bool:
    """Mark ``intent`` dead with ``kind``; False when the lease was lost."""
    t = check_table(table)
    with d.write(conn):
        now = d.now_ns(conn)
        cur = conn.execute(d.q(
            f"UPDATE {t} SET dead_at_ns = ?, lease_until_ns = NULL, last_error_kind = ? "
            "WHERE id = ? AND attempts = ? AND lease_owner = ? AND dead_at_ns IS NULL"),
            [now, kind, intent.id, intent.attempt, intent.lease_owner])
        return int(cur.rowcount) == 1


def requeue_dead(conn: DbConnection, d: Dialect, table: str, kind: str | None) -> int:
    """Give dead intents (of ``kind``, or all) a fresh set of attempts, due now; how many."""
    t = check_table(table)
    with d.write(conn):
        now = d.now_ns(conn)
        sql = f"UPDATE {t} SET dead_at_ns = NULL, attempts = 0, due_ns = ? WHERE dead_at_ns IS NOT NULL"
        params: list[object] = [now]
        if kind is not None:
            sql += " AND last_error_kind = ?"
            params.append(kind)
        return int(conn.execute(d.q(sql), params).rowcount)


def counts(conn: DbConnection, d: Dialect, table: str) -> Counts:
    # Two reads, no write lock: the numbers are a gauge, not a snapshot to act on.
    t = check_table(table)
    now = d.now_ns(conn)
    live = conn.execute(d.q(
        f"SELECT COALESCE(SUM(CASE WHEN lease_until_ns > ? THEN 1 ELSE 0 END), 0), COUNT(*) "
        f"FROM {t} WHERE dead_at_ns IS NULL"), [now]).fetchone()
    dead = conn.execute(f"SELECT COALESCE(last_error_kind, ''), COUNT(*) FROM {t} "
                        "WHERE dead_at_ns IS NOT NULL GROUP BY 1").fetchall()
    leased, total = int(live[0]), int(live[1])
    by_kind = {str(k): int(n) for k, n in dead}
    return Counts(pending=total - leased, leased=leased, dead=sum(by_kind.values()), dead_by_kind=by_kind)
