"""Helpers of the outbox tests: a backend (DSN + service connections) and the service side."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from streamsched.model.event import TransitionEvent
from streamsched.outbox import Outbox


@dataclass(frozen=True)
class Backend:
    """One database for a test: its relay DSN and a factory of service connections (ordinary
    transactional connections, as a service would hold)."""

    name: str
    dsn: str
    connect: Callable[[], Any]


@contextlib.contextmanager
def service_tx(backend: Backend) -> Iterator[Any]:
    """The service's own transaction: commit on success, roll back on an exception."""
    conn = backend.connect()
    try:
        if backend.name == "sqlite":
            with conn:
                yield conn
        else:
            with conn.transaction():
                yield conn
    finally:
        conn.close()


def prepare(backend: Backend, table: str, **opts: Any) -> Outbox:
    """An Outbox over ``table``, its schema created (twice: it is idempotent)."""
    outbox = Outbox(backend.dsn, table=table, **opts)
    with service_tx(backend) as conn:
        outbox.create_schema(conn)
        outbox.create_schema(conn)
    return outbox


def enqueue(backend: Backend, outbox: Outbox, events: list[TransitionEvent], topic: str = "orders") -> None:
    """Enqueue ``events`` in one committed service transaction."""
    with service_tx(backend) as conn:
        for ev in events:
            outbox.enqueue(conn, topic, ev)
