"""A SQLite ledger standing in for an external system with an idempotent, fence-checking API.

It is what a well-behaved destination of an external command looks like: a UNIQUE idempotency
key makes repeats no-ops, and a per-key high-water fence refuses writes from a stale owner.
Every call is also logged in ``calls`` so tests can check that fences only ever increase.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Literal, overload

from streamsched.errors import StaleFence

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY, run_id TEXT NOT NULL, fence INTEGER NOT NULL, at_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fences (idempotency_key TEXT PRIMARY KEY, fence INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL, fence INTEGER NOT NULL,
    accepted INTEGER NOT NULL, at_ns INTEGER NOT NULL);
"""


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def complete(self, idempotency_key: str, fence: int, run_id: str) -> bool:
        """Record the run's completion once; True if this call made the effect."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT fence FROM fences WHERE idempotency_key = ?",
                             (idempotency_key,)).fetchone()
            if row is not None and row[0] > fence:
                db.execute("INSERT INTO calls (idempotency_key, fence, accepted, at_ns) VALUES (?,?,0,?)",
                           (idempotency_key, fence, time.time_ns()))
                db.execute("COMMIT")
                raise StaleFence("ledger", fence, row[0])
            db.execute("INSERT INTO fences (idempotency_key, fence) VALUES (?, ?) "
                       "ON CONFLICT(idempotency_key) DO UPDATE SET fence = excluded.fence",
                       (idempotency_key, fence))
            cur = db.execute("INSERT OR IGNORE INTO effects (idempotency_key, run_id, fence, at_ns) "
                             "VALUES (?, ?, ?, ?)", (idempotency_key, run_id, fence, time.time_ns()))
            db.execute("INSERT INTO calls (idempotency_key, fence, accepted, at_ns) VALUES (?,?,1,?)",
                       (idempotency_key, fence, time.time_ns()))
            db.execute("COMMIT")
            return cur.rowcount == 1
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def effects(self) -> list[tuple[str, str, int]]:
        with self._connect() as db:
            return list(db.execute("SELECT idempotency_key, run_id, fence FROM effects"))

    @overload
    def calls(self) -> list[tuple[str, int, int]]: ...
    @overload
    def calls(self, *, with_time: Literal[True]) -> list[tuple[str, int, int, int]]: ...

    def calls(self, *, with_time: bool = False) -> list[Any]:
        """Every call in the order the ledger took them: (idempotency key, fence, accepted), and
        with ``with_time`` also when (``time.time_ns()`` as the call was recorded)."""
        columns = "idempotency_key, fence, accepted" + (", at_ns" if with_time else "")
        with self._connect() as db:
            return list(db.execute(f"SELECT {columns} FROM calls ORDER BY id"))
