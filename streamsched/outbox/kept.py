"""Delivered intents kept for a window, so they can be sent again: after a failover to a mirrored
cluster, the events the mirror had not carried when the primary was lost are re-sent to the new
one (a re-send is harmless: an identity that already has an outcome is released without running).

They live in a table of their own, ``<table>_sent``, never in the outbox table: that one holds
only the backlog and the dead, so its claim index stays small whatever the window.

============== ==================================================================================
id             the intent's id in the outbox table when it was delivered
topic, event_id, key, value, created_ns, traceparent
               as the intent had them (the same event: the same identity and idempotency key)
delivered_ns   when it was acknowledged (the clock of the relay's acks: the database's on
               PostgreSQL, the relay host's on SQLite)
============== ==================================================================================

An ack moves the delivered rows here in its own write transaction and drops what is older than
the window. :func:`resend` moves rows delivered since a time back into the outbox table as new
intents, due now; delivered again, they come back here. A relay with a window creates the table
at its first ack if it is missing, so an outbox table made before this existed gains it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

DbConnection = Any
"""A DB-API connection, as :mod:`streamsched.outbox.sql` takes it."""


class Dialect(Protocol):
    """What this module uses of :class:`streamsched.outbox.sql.Dialect` (which imports this one)."""

    blob: str
    lock_rows: str

    def q(self, sql: str) -> str: ...

    def now_ns(self, conn: DbConnection) -> int: ...

    def write(self, conn: DbConnection) -> AbstractContextManager[None]: ...

    def table_exists(self, conn: DbConnection, name: str) -> bool: ...

_KEPT = "topic, event_id, key, value, created_ns, traceparent"
_CHUNK = 500
"""Ids per statement of a re-send (well under SQLite's 32766 parameters)."""


def sent_table(table: str) -> str:
    """The kept intents' table of outbox ``table`` (a name :func:`~streamsched.outbox.sql.check_table`
    accepted: the suffix keeps it within PostgreSQL's 63 characters)."""
    return f"{table}_sent"


def create(conn: DbConnection, d: Dialect, table: str) -> None:
    """Create ``<table>_sent`` and its time index if missing (in the caller's transaction)."""
    s = sent_table(table)
    conn.execute(f"""CREATE TABLE IF NOT EXISTS {s} (
        id BIGINT NOT NULL,
        topic TEXT NOT NULL,
        event_id TEXT NOT NULL,
        key {d.blob} NOT NULL,
        value {d.blob} NOT NULL,
        created_ns BIGINT NOT NULL,
        delivered_ns BIGINT NOT NULL,
        traceparent TEXT)""")
    conn.execute(f"CREATE INDEX IF NOT EXISTS {s}_delivered ON {s} (delivered_ns)")


def keep(conn: DbConnection, d: Dialect, table: str, ids: Sequence[int], now: int, window_ns: int) -> None:
    """Copy the delivered ``ids`` into ``<table>_sent`` and drop rows older than ``window_ns``
    (inside the ack's write transaction, before it deletes them from the outbox table)."""
    s = sent_table(table)
    marks = ", ".join("?" for _ in ids)
    conn.execute(d.q(f"INSERT INTO {s} (id, {_KEPT}, delivered_ns) SELECT id, {_KEPT}, ? FROM {table} "
                     f"WHERE id IN ({marks})"), [now, *ids])
    conn.execute(d.q(f"DELETE FROM {s} WHERE delivered_ns < ?"), [now - window_ns])


@dataclass(frozen=True)
class Resent:
    """What :func:`resend` did: ``resent`` intents made due again; ``oldest_kept_ns``, the oldest
    delivery still kept before it (None: none), which says whether the window reached back to
    ``since``."""

    resent: int
    oldest_kept_ns: int | None


def resend(conn: DbConnection, d: Dialect, table: str, since_ns: int, topic: str | None) -> Resent:
    """Move the intents delivered at or after ``since_ns`` (to ``topic``, or any) back into the
    outbox table, due now. Rows are moved by id, chunk by chunk, under the write lock (locked
    rows on PostgreSQL), so a row a concurrent ack keeps meanwhile is neither moved nor dropped."""
    s = sent_table(table)
    where = "delivered_ns >= ?"
    params: list[object] = [since_ns]
    if topic is not None:
        where += " AND topic = ?"
        params.append(topic)
    with d.write(conn):
        now = d.now_ns(conn)
        oldest = conn.execute(f"SELECT MIN(delivered_ns) FROM {s}").fetchone()[0]
        rows = conn.execute(d.q(f"SELECT id FROM {s} WHERE {where} ORDER BY id{d.lock_rows}"), params)
        ids = [int(r[0]) for r in rows.fetchall()]
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start:start + _CHUNK]
            marks = ", ".join("?" for _ in chunk)
            conn.execute(d.q(f"INSERT INTO {table} ({_KEPT}, due_ns) SELECT {_KEPT}, ? FROM {s} "
                             f"WHERE id IN ({marks}) ORDER BY id"), [now, *chunk])
            conn.execute(d.q(f"DELETE FROM {s} WHERE id IN ({marks})"), chunk)
        return Resent(len(ids), None if oldest is None else int(oldest))


def exists(conn: DbConnection, d: Dialect, table: str) -> bool:
    """Whether ``<table>_sent`` exists (an outbox table made before kept intents has none)."""
    return d.table_exists(conn, sent_table(table))


def count(conn: DbConnection, d: Dialect, table: str) -> int:
    """Kept intents (0 when the table has no kept intents' table yet)."""
    if not exists(conn, d, table):
        return 0
    return int(conn.execute(f"SELECT COUNT(*) FROM {sent_table(table)}").fetchone()[0])
