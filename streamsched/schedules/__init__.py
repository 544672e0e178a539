"""Durable schedules: the catalog client and the ticker that fires them.

Lives here: ``catalog`` (schedule/unschedule/enable/disable/list/history/trigger/backfill
over compacted topics), ``manual`` (what a trigger or backfill request asks for), ``ticker``
(the consumer-group member, on :mod:`streamsched.kafka.owner`), ``restore`` (one owned catalog
partition read behind a read barrier), ``tick`` (its loop and the steps of one tick) over
``book`` (what the partition knows), ``plan`` (resets and due fires), ``feedback`` (trusted
attempt results) and ``checkpoint`` (the tick's one transaction), ``requests`` (the operator
requests a partition applies in its ticks) and ``targets`` (targets it cannot write).

May import: ``model``, ``wire``, ``kafka``, ``errors``, ``metrics``, ``failpoints``. Never
``streamsched.worker`` (the two meet only in ``model`` and ``wire``: the feedback a worker
writes is a :mod:`streamsched.wire.schedule` record), never ``ops``.
"""
