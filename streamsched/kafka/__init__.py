"""Kafka plumbing: every client, admin call, read and transactional write goes through here.

Lives here: ``admin`` (topic definitions, apply, cached partition counts), ``reads`` (lag,
whole-topic and streamed partition reads), ``writer`` (grouped transactional writes and the
one murmur2 partitioner), ``owner`` (the fenced per-partition owner runtime the worker and the
ticker share).

May import: ``streamsched.model``, ``streamsched.wire``, ``streamsched.errors``,
``streamsched.metrics``, aiokafka. Never ``worker``, ``schedules`` or ``ops``.
"""
