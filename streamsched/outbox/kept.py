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
intents, due now; delivered again, they come back here.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

DbConnection = Any
"""A DB-API connection, as :mod:`streamsched.outbox.sql` takes it."""


class Dialect(Protocol):
    """What this module uses of :class:`streamsched.outbox.sql.Dialect` (which imports this one)."""

    blob: str

    def q(self, sql: str) -> str: ...

    def now_ns(self, conn: DbConnection) -> int: ...

    def write(self, conn: DbConnection) -> AbstractContextManager[None]: ...

_KEPT = "topic, event_id, key, value, created_ns, traceparent"


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


def resend(conn: DbConnection, d: Dialect, table: str, since_ns: int, topic: str | None) -> int:
    """Move the intents delivered at or after ``since_ns`` (to ``topic``, or any) back into the
    outbox table, due now; how many."""
    s = sent_table(table)
    where = "delivered_ns >= ?"
    params: list[object] = [since_ns]
    if topic is not None:
        where += " AND topic = ?"
        params.append(topic)
    with d.write(conn):
        now = d.now_ns(conn)
        cur = conn.execute(d.q(f"INSERT INTO {table} ({_KEPT}, due_ns) SELECT {_KEPT}, ? FROM {s} "
                               f"WHERE {where} ORDER BY id"), [now, *params])
        moved = int(cur.rowcount)
        conn.execute(d.q(f"DELETE FROM {s} WHERE {where}"), params)
        return moved


def count(conn: DbConnection, d: Dialect, table: str) -> int:
    return int(conn.execute(f"SELECT COUNT(*) FROM {sent_table(table)}").fetchone()[0])
