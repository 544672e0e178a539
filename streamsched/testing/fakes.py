"""An in-memory Kafka for broker-free unit tests of pure logic (the turn, the ticker, offsets).

It is faithful to the semantics streamsched builds on, and to nothing else:

* a topic is a list of partitions, each an append-only log; offsets are allocated when a record
  is produced, so an aborted record and a transaction marker each take one offset, as on a broker
  (a read_committed consumer's position therefore moves past offsets it never returns);
* a transaction's records are invisible to read_committed consumers, which stop at the last stable
  offset (the first offset of any open transaction); ``commit_transaction`` writes a COMMIT marker
  to every partition it touched and applies its group offsets, ``abort_transaction`` writes ABORT
  markers and its records and offsets vanish;
* fencing: starting a producer with a transactional id bumps the id's epoch and aborts the open
  transaction of the previous incarnation; from then on every write, offset send and commit of the
  old incarnation raises ``aiokafka.errors.ProducerFenced``. ``begin_transaction`` is local in
  aiokafka (no broker round trip), so here too it only fails once the producer knows it is fenced;
* committed offsets per consumer group, written by transactions or by ``FakeConsumer.commit``.

Not modelled, because Kafka facts come from Kafka: replication, leaders, retention, compaction,
rebalances, metadata, timeouts, request sizes. The surface is what streamsched's turn, grouped
writer and ticker use (see each method), with aiokafka's names and signatures.

Failure injection for abort paths: :meth:`FakeProducer.fail` makes the next call of one operation
raise a given exception before it has any effect; :meth:`FakeProducer.before` runs a callback just
before an operation (for example :meth:`FakeKafka.fence`, to fence a producer mid-transaction).

Import everything from here; the pieces live beside it, by concept:

* :mod:`~streamsched.testing.fake_types`: the values handed out (records, metadata, partitions);
* :mod:`~streamsched.testing.fake_cluster`: :class:`FakeCluster`, the logs, the transaction
  coordinator and group offsets; every rule above about them is enforced there, in one place;
* :mod:`~streamsched.testing.fake_producer`: :class:`FakeProducer` and :class:`FakeBatch`;
* :mod:`~streamsched.testing.fake_consumer`: :class:`FakeConsumer`;
* here: :class:`FakeKafka`, the cluster a test holds, which also makes clients over itself.
  It is defined here, not in the cluster's module, because the clients import the cluster: the
  modules import one way (cluster <- clients <- this one).
"""

from __future__ import annotations

from streamsched.testing.fake_cluster import FakeCluster
from streamsched.testing.fake_consumer import FakeConsumer
from streamsched.testing.fake_producer import FakeBatch, FakeProducer
from streamsched.testing.fake_types import (
    DEFAULT_BATCH_BYTES,
    BatchMetadata,
    FakeRecord,
    Header,
    Isolation,
    ProducerOp,
    RecordMetadata,
    TopicPartition,
    Transaction,
)

__all__ = ["DEFAULT_BATCH_BYTES", "BatchMetadata", "FakeBatch", "FakeCluster", "FakeConsumer", "FakeKafka",
           "FakeProducer", "FakeRecord", "Header", "Isolation", "ProducerOp", "RecordMetadata",
           "TopicPartition", "Transaction"]


class FakeKafka(FakeCluster):
    """One in-memory cluster (:class:`FakeCluster`) and the clients a test makes over it."""

    def producer(self, transactional_id: str | None = None, *,
                 max_batch_size: int = DEFAULT_BATCH_BYTES) -> FakeProducer:
        return FakeProducer(self, transactional_id, max_batch_size=max_batch_size)

    def consumer(self, group_id: str | None = None, *,
                 isolation_level: Isolation = "read_committed") -> FakeConsumer:
        return FakeConsumer(self, group_id, isolation_level=isolation_level)
