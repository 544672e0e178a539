"""The transactional outbox: services enqueue transitions in their own DB transaction; a relay
publishes them to Kafka (docs/outbox.md).

What lives here:

* :mod:`streamsched.outbox.core` — :class:`Outbox`: ``create_schema``/``enqueue`` on the
  caller's connection, and the pull relay (``claim``, ``run_once``, ``relay``, ``counts``);
* :mod:`streamsched.outbox.sql` — the table, its statements and the two dialects (SQLite, the
  embedded default; PostgreSQL through psycopg 3 with ``FOR UPDATE SKIP LOCKED``);
* :mod:`streamsched.outbox.deliver` — the default ``deliver``, publishing with
  :class:`streamsched.kafka.producer.Producer` in the wire format of each topic's definition.

Layer: the outbox imports ``model``, ``wire``, ``kafka``, ``errors`` and the cross-cutting
``metrics`` and ``failpoints``; never ``worker``, ``schedules`` or ``ops`` (``ops`` imports it
for the ``streamsched outbox`` command).
"""

from __future__ import annotations

from streamsched.outbox.core import DEFAULT_TABLE, FAILPOINT_AFTER_SEND, Deliver, Outbox
from streamsched.outbox.sql import Counts, Intent

__all__ = ["DEFAULT_TABLE", "FAILPOINT_AFTER_SEND", "Counts", "Deliver", "Intent", "Outbox"]
