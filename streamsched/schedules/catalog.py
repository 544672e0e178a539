"""The durable schedule catalog: definitions, state and history in compacted Kafka topics.

One catalog (default name ``default``) owns four co-partitioned topics::

    __streamsched.schedules.<catalog>.definitions   compacted, key = schedule name
    __streamsched.schedules.<catalog>.state         compacted, key = schedule name
    __streamsched.schedules.<catalog>.history       compacted, key = <name>/<row mod 256>
    __streamsched.schedules.<catalog>.feedback      delete, attempt results from target workers

Every record of one schedule goes to partition ``murmur2(name) % partitions`` of each topic,
so whoever owns that partition of the definitions topic (a member of the ticker group) owns the
schedule: partition ownership plus the ticker's fenced transactional producer is the only lock.

:class:`Catalog` is the client side: ``schedule`` upserts by name, ``unschedule`` deletes,
``enable``/``disable`` advance the definition version (which makes the ticker reset the state),
``list`` and ``history`` read the topics. ``trigger`` and ``backfill`` write a request
(:class:`~streamsched.model.schedule.Request`) on the schedule's partition of the definitions
topic, which the schedule's ticker applies (:mod:`streamsched.schedules.requests`): the catalog
never writes state or history itself, so nothing races the ticker that owns them.

Reads never drop a record silently: each unreadable one is counted and reported
(:mod:`streamsched.schedules.listing`).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from streamsched.errors import BoundExceeded, ConfigError, StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.jsonval import json_dumps, json_loads
from streamsched.model.limits import MAX_HISTORY_ROWS, MAX_PAYLOAD_BYTES
from streamsched.model.names import internal_topic, validate_name
from streamsched.model.overlap import Overlap, check_overlap
from streamsched.model.schedule import (
    DEFAULT_BACKFILL_MAX,
    Definition,
    HistoryRow,
    Policy,
    Request,
    ScheduleInfo,
    State,
)
from streamsched.model.specs import parse_spec
from streamsched.schedules import manual
from streamsched.schedules.listing import UNREADABLE, Latest, Listing, Skips, read_definition, read_state
from streamsched.wire.schedule import (
    DEFINITION_CODEC,
    HISTORY_CODEC,
    decode_request,
    definition_headers,
    encode_request,
    request_key,
    request_name,
)

log = logging.getLogger(__name__)

_V = TypeVar("_V")
Write = tuple[str, bytes | None, Sequence[tuple[str, bytes]] | None]
"""A record of the definitions topic to write: key, value (None: a tombstone), headers."""


def _encoded(defn: Definition) -> Write:
    return defn.name, DEFINITION_CODEC.encode(defn.to_record()), definition_headers(defn)


class Catalog:
    """Client of one schedule catalog (see module docs)."""

    def __init__(self, bootstrap: clients.Conn, name: str = "default", *, partitions: int = 4,
                 replication: int | None = None, allow_single_replica: bool = False,
                 create_topics: bool = True) -> None:
        self.bootstrap = bootstrap
        self.name = validate_name(name, "catalog")
        self.partitions = partitions
        self.replication = replication
        """Of the catalog's topics; None: ``min(3, brokers)`` (streamsched.kafka.admin)."""
        self.allow_single_replica = allow_single_replica
        self.create_topics = create_topics
        """False: :meth:`ensure_topics` only verifies (a role without CREATE; ``topics apply --catalog``)."""

    @functools.cached_property
    def definitions_topic(self) -> str:
        return internal_topic("schedules", self.name, "definitions")

    @functools.cached_property
    def state_topic(self) -> str:
        return internal_topic("schedules", self.name, "state")

    @functools.cached_property
    def history_topic(self) -> str:
        return internal_topic("schedules", self.name, "history")

    @functools.cached_property
    def feedback_topic(self) -> str:
        return internal_topic("schedules", self.name, "feedback")

    @functools.cached_property
    def group(self) -> str:
        return f"streamsched.schedules.{self.name}"

    def topic_specs(self) -> list[TopicSpec]:
        n, rf = self.partitions, self.replication
        return [TopicSpec(self.definitions_topic, n, rf, kind="state"),
                TopicSpec(self.state_topic, n, rf, kind="state"),
                TopicSpec(self.history_topic, n, rf, kind="state"),
                # Nothing parks here (not a delay topic, whose retention rules are its own): attempt
                # results the ticker consumes, deleted after 7 days as since the catalog's first version.
                TopicSpec(self.feedback_topic, n, rf, kind="output",
                          config={"cleanup.policy": "delete", "retention.ms": str(7 * 86_400_000)})]

    async def ensure_topics(self) -> None:
        """Create the catalog's topics (durable by default) and verify them.

        With the replication left to the default, topics an operator made with another one are
        accepted and the difference logged; an explicit replication refuses it.
        """
        report = await apply(self.bootstrap, self.topic_specs(), allow_drift=self.replication is None,
                             allow_single_replica=self.allow_single_replica, create=self.create_topics)
        for drift in report.drift:
            log.warning("%s", drift)

    # --- reads ----------------------------------------------------------------------------------

    async def _latest(self, topic: str, decode: Callable[[ConsumerRecord], _V],
                      requests: dict[str, manual.Stored] | None = None) -> Latest[_V]:
        """The latest readable record per key of a compacted topic (tombstones delete); request
        records of the definitions topic go to ``requests`` (or are passed over)."""
        out: Latest[_V] = Latest()
        skips = Skips(topic)
        for rec in await read_topic(self.bootstrap, topic):
            try:
                key = rec.key.decode() if rec.key else ""
                if request_name(key) is not None:
                    if requests is None:
                        continue
                    if rec.value is None:
                        requests.pop(key, None)
                    else:
                        req = decode_request(key, rec.value)
                        requests[key] = manual.Stored(rec.partition, rec.offset, req)
                    continue
                if rec.value is None:
                    out.pop(key, None)
                    continue
                out[key] = decode(rec)
            except UNREADABLE:
                skips.add(rec)  # the key's previous readable record (if any) stands
        out.skipped_corrupt = skips.report()
        return out

    async def definitions(self) -> Latest[Definition]:
        return await self._latest(self.definitions_topic, read_definition)

    async def states(self) -> Latest[State]:
        return await self._latest(self.state_topic, read_state)

    async def list(self) -> Listing[ScheduleInfo]:
        """Every schedule with its state, by name (a paused one with its newest pause's reason);
        ``skipped_corrupt`` counts the definition and state records that could not be read."""
        requests: dict[str, manual.Stored] = {}
        defs = await self._latest(self.definitions_topic, read_definition, requests)
        states = await self.states()
        reasons = {r.request.name: r.request.reason
                   for r in sorted(requests.values(), key=lambda r: r.offset) if r.request.kind == "pause"}
        return Listing((ScheduleInfo(d, states.get(n), reasons.get(n)) for n, d in sorted(defs.items())),
                       skipped_corrupt=defs.skipped_corrupt + states.skipped_corrupt)

    async def history(self, name: str, *, limit: int = MAX_HISTORY_ROWS) -> Listing[HistoryRow]:
        """The retained attempts of ``name`` (at most 256), oldest first; ``skipped_corrupt``
        counts the records under ``name``'s keys that could not be read."""
        validate_name(name, "schedule")
        rows: dict[bytes, tuple[int, HistoryRow]] = {}
        prefix = f"{name}/".encode()
        skips = Skips(self.history_topic)
        for rec in await read_topic(self.bootstrap, self.history_topic):
            if not rec.key or not rec.key.startswith(prefix) or rec.value is None:
                continue
            try:
                row = HistoryRow.from_record(HISTORY_CODEC.decode(rec.value))
            except UNREADABLE:
                skips.add(rec)
                continue
            rows[rec.key] = (rec.offset, row)
        ordered = [row for _, row in sorted(rows.values(), key=lambda t: t[0])]
        return Listing(ordered[-limit:], skipped_corrupt=skips.report())

    # --- writes ---------------------------------------------------------------------------------

    async def _write_many(self, records: builtins.list[Write]) -> None:
        """Write ``records`` (key, value, headers) to the definitions topic, each on its
        schedule's partition: a request's is its schedule's, whatever its own key hashes to."""
        if not records:
            return
        producer = clients.producer(self.bootstrap)
        await producer.start()
        try:
            # The topic's own partition count, not the one this client was told: a command that
            # names a catalog (rm, trigger, ...) must find the partition its ticker reads.
            n = len(await producer.partitions_for(self.definitions_topic) or ()) or self.partitions
            futures = [await producer.send(self.definitions_topic, value, key=name.encode(), headers=headers,
                                           partition=partition_for_key((request_name(name) or name).encode(),
                                                                       n))
                       for name, value, headers in records]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    async def schedule(self, name: str, spec: str, target: str, payload: object = None, *,
                       event_type: str = "due", tenant: str = "", policy: Policy = "catch_up",
                       timezone: str | None = None, enabled: bool = True,
                       overlap: Overlap = "allow") -> Definition:
        """Create or replace the schedule ``name`` (upsert); a change advances its version.
        ``overlap``: what a boundary does while the previous run has not resolved
        (:mod:`streamsched.model.overlap`)."""
        [defn] = await self.schedule_many([dict(name=name, spec=spec, target=target, payload=payload,
                                                event_type=event_type, tenant=tenant, policy=policy,
                                                timezone=timezone, enabled=enabled, overlap=overlap)])
        return defn

    async def schedule_many(self, items: Iterable[dict[str, Any]]) -> builtins.list[Definition]:
        """Upsert several schedules (keyword arguments of :meth:`schedule` each) with one read
        of the catalog; every item is validated before anything is written."""
        current = await self.definitions()
        planned: builtins.list[tuple[Definition, bool]] = []
        for item in items:
            defn = self._definition(current.get(item["name"]), **item)
            old = current.get(defn.name)
            unchanged = old is not None and replace(old, version=defn.version,
                                                    created_ns=defn.created_ns) == defn
            planned.append((old if unchanged and old is not None else defn, not unchanged))
            current[defn.name] = planned[-1][0]
        changed = [_encoded(d) for d, new in planned if new]
        await self._write_many(changed)
        return [d for d, _ in planned]

    def _definition(self, current: Definition | None, *, name: str, spec: str, target: str,
                    payload: object = None, event_type: str = "due", tenant: str = "",
                    policy: Policy = "catch_up", timezone: str | None = None,
                    enabled: bool = True, overlap: str = "allow") -> Definition:
        validate_name(name, "schedule")
        validate_name(target, "topic")
        validate_name(event_type, "event type")
        if policy not in ("catch_up", "coalesce"):
            raise ConfigError(f"policy must be 'catch_up' or 'coalesce', not {policy!r}")
        checked = check_overlap(overlap)
        parse_spec(spec, timezone=timezone)  # InvalidSpec with the reason
        body = payload if isinstance(payload, bytes) else json_dumps({} if payload is None else payload)
        json_loads(body)
        if len(body) > MAX_PAYLOAD_BYTES:
            raise BoundExceeded("schedule payload bytes", MAX_PAYLOAD_BYTES, len(body))
        return Definition(name=name, spec=spec, target_topic=target, payload=body,
                          version=(current.version + 1) if current else 1, enabled=enabled,
                          policy=policy, created_ns=time.time_ns(), timezone=timezone,
                          event_type=event_type, tenant=tenant, overlap=checked)

    async def unschedule(self, name: str) -> bool:
        """Delete ``name`` and its requests; True if it existed. Its ticker stops firing it."""
        validate_name(name, "schedule")
        requests: dict[str, manual.Stored] = {}
        if name not in await self._latest(self.definitions_topic, read_definition, requests):
            return False
        doomed = [name] + [k for k, r in requests.items() if r.request.name == name]
        await self._write_many([(k, None, None) for k in doomed])
        return True

    # --- requests (applied by the schedule's ticker) ----------------------------------------------

    async def trigger(self, name: str, *, at_ns: int | None = None) -> manual.Receipt:
        """Run ``name`` once now, as the occurrence ``<schedule-id>/<at_ns>`` (default: now; moved
        by 1 ns if it is a boundary of the spec, so it never is a scheduled occurrence)."""
        validate_name(name, "schedule")
        requests: dict[str, manual.Stored] = {}
        defs = await self._latest(self.definitions_topic, read_definition, requests)
        req, receipt = manual.trigger(self._existing(defs, name), at_ns)
        await self._request(req, defs, requests)
        return receipt

    async def backfill(self, name: str, from_ns: int, to_ns: int, *, max: int = DEFAULT_BACKFILL_MAX,
                       dry_run: bool = False, now_ns: int | None = None) -> manual.Receipt:
        """Run every occurrence of ``name``'s spec in ``[from_ns, to_ns]``, each with its scheduled
        identity (those that already ran are resolved by the target from their stored outcome).
        More than ``max`` occurrences (64 unless told; at most 10,000) is
        :class:`~streamsched.schedules.manual.BackfillTooLarge`; a window reaching past now is
        refused. ``dry_run``: only say which occurrences."""
        validate_name(name, "schedule")
        manual.check_window(from_ns, to_ns, max, time.time_ns() if now_ns is None else now_ns)
        requests: dict[str, manual.Stored] = {}
        defs = await self._latest(self.definitions_topic, read_definition, requests)
        req, receipt = manual.backfill(self._existing(defs, name), from_ns, to_ns, max, dry_run=dry_run)
        if req is not None:
            await self._request(req, defs, requests)
        return receipt

    async def pause(self, name: str, *, reason: str = "") -> manual.Receipt:
        """Stop firing ``name``, keeping its catch-up position; its ticker applies it. Pausing a
        paused schedule writes nothing (the receipt's request is None)."""
        return await self._hold(name, pause=True, reason=reason)

    async def resume(self, name: str) -> manual.Receipt:
        """Fire ``name`` again: what its pause missed fires under its catch-up policy."""
        return await self._hold(name, pause=False)

    async def _hold(self, name: str, *, pause: bool, reason: str = "") -> manual.Receipt:
        validate_name(name, "schedule")
        requests: dict[str, manual.Stored] = {}
        defs = await self._latest(self.definitions_topic, read_definition, requests)
        defn = self._existing(defs, name)
        req, receipt = manual.hold(defn, (await self.states()).get(name), pause=pause, reason=reason)
        if req is not None:
            await self._request(req, defs, requests)
        return receipt

    @staticmethod
    def _existing(defs: Latest[Definition], name: str) -> Definition:
        defn = defs.get(name)
        if defn is None:
            raise ConfigError(f"no schedule named {name!r} in this catalog")
        return defn

    async def _request(self, req: Request, defs: Latest[Definition],
                       requests: dict[str, manual.Stored]) -> None:
        """Write ``req`` on its schedule's partition, with tombstones for requests that are
        applied and no longer needed (best effort: without the group's offsets, none)."""
        from aiokafka.errors import KafkaError

        stale: builtins.list[str] = []
        if requests:
            try:
                applied = await self._applied_offsets({r.partition for r in requests.values()})
                stale = manual.stale(defs, requests, applied)
            except (KafkaError, StreamschedError, OSError, TimeoutError):  # clean-up is optional
                log.debug("could not read the applied request offsets; no clean-up", exc_info=True)
        await self._write_many([(request_key(req.name, req.request_id), encode_request(req), None)]
                               + [(k, None, None) for k in stale])

    async def _applied_offsets(self, partitions: set[int]) -> dict[int, int]:
        """The ticker group's committed offset per definitions partition (requests below it are
        applied). Reading them joins no group."""
        from aiokafka import TopicPartition

        consumer = clients.consumer(self.bootstrap, group_id=self.group)
        await consumer.start()
        try:
            out = {}
            for p in partitions:
                committed = await consumer.committed(TopicPartition(self.definitions_topic, p))
                out[p] = committed or 0
            return out
        finally:
            await consumer.stop()

    async def _set_enabled(self, name: str, enabled: bool) -> bool:
        validate_name(name, "schedule")
        current = (await self.definitions()).get(name)
        if current is None:
            return False
        defn = replace(current, enabled=enabled, version=current.version + 1, created_ns=time.time_ns())
        await self._write_many([_encoded(defn)])
        return True

    async def enable(self, name: str) -> bool:
        """Enable ``name``: advances the version and resets its state (no catch-up of the pause)."""
        return await self._set_enabled(name, True)

    async def disable(self, name: str) -> bool:
        """Disable ``name``: advances the version; the ticker stops firing it."""
        return await self._set_enabled(name, False)
