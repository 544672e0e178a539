"""Durable schedules: the catalog client and the ticker that fires them.

Lives here: ``catalog`` (schedule/unschedule/enable/disable/list/history over compacted
topics), ``ticker`` (the consumer-group member, on :mod:`streamsched.kafka.owner`) and
``tick`` (one owned catalog partition: restore, trusted feedback, fire + advance in one
transaction).

May import: ``model``, ``wire``, ``kafka``, ``errors``, ``metrics``, ``failpoints``. Never
``streamsched.worker`` (the two meet only in ``model`` and ``wire``: the feedback a worker
writes is a :mod:`streamsched.wire.schedule` record), never ``ops``.
"""
