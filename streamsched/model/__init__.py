"""The pure domain model: events, identities, claims, retry policy, schedules and their bounds.

Lives here: ``event`` (TransitionEvent and its bounds), ``jsonval`` (canonical bounded JSON),
``cron`` and ``instants`` (cron matching on croniter, wall time to instants across DST),
``identity`` (business/claim/release identities, route keys), ``claims`` (the fenced claim
state machine), ``retry`` (RetryPolicy, compute_backoff, failure normalisation), ``specs``
(the schedule spec grammar and bounded catch-up), ``schedule`` (definitions, state, history),
``limits`` and ``names`` (every bound, name validation).

May import: the standard library, croniter, orjson, ``streamsched.errors`` and each other.
Never Kafka, never I/O.
"""
