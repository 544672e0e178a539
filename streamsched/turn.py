"""The six-step worker turn, batched per partition.

For a batch of at most ``max_in_flight`` records of one partition:

1. select   decode, filter by the selection, resolve the business identity; records that cannot
            be decoded or violate a bound become dead letters (never dropped);
2. resolve  identities already carrying a stored outcome are not executed again;
3. claim    one transaction writes a fresh fenced claim (fence+1, ordinal+1) per identity;
4. execute  commands run concurrently, each with its immutable context;
5. release  one transaction writes outcomes, emitted events, releases (exact successor
            revisions), dead letters and the offset of the batch's last record + 1;
6. commit   the offset is part of that transaction, so it is never visible before the state.

Two transactions per batch instead of three round trips per item is where the throughput
comes from (see bench/turns.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import failpoints
from .app import CommandContext, Commands, Emit, SchedulerDef, Turn
from .claims import ClaimState, Outcome, OutcomeKind
from .codecs import AvroCodec, TransitionEvent, decode_transition, json_dumps
from .errors import DecodeError, StreamschedError
from .identity import business_identity, route_key
from .metrics import Metrics
from .retries import RetryPolicy, compute_backoff, normalize_failure
from .state import CLAIM_CODEC, PartitionState

log = logging.getLogger(__name__)

DEAD_LETTER_CODEC = AvroCodec("dead_letter")
IN_PLACE_RETRY_LIMIT_S = 2.0
"""Backoffs up to this long wait inside the turn; longer ones end the attempt (see README)."""


@dataclass(slots=True)
class Item:
    record: Any
    event: TransitionEvent | None = None
    identity: str = ""
    dead: tuple[str, str] | None = None
    follower: bool = False
    state: ClaimState | None = None
    outcome: Outcome | None = None
    emits: list[Emit] = field(default_factory=list)


class TurnRunner:
    """Runs batches for one partition through its fenced transactional producer."""

    def __init__(self, scheduler: SchedulerDef, partition: int, producer: Any, state: PartitionState,
                 *, owner: str, metrics: Metrics, clock: Callable[[], int] = time.time_ns,
                 retry: RetryPolicy | None = None) -> None:
        self.s = scheduler
        self.partition = partition
        self.producer = producer
        self.state = state
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.retry = retry or scheduler.extra.get("retry") or RetryPolicy()
        self._rng = random.Random()

    # --- 1. select ----------------------------------------------------------------------------

    def _prepare(self, rec: Any) -> Item:
        failpoints.hit("after_select")
        item = Item(rec)
        if rec.value is None:
            item.dead = ("decode", "record has no value")
            return item
        try:
            ev = decode_transition(rec.value)
        except DecodeError as exc:
            item.dead = ("decode", exc.reason)
            return item
        item.event = ev
        if not self.s.selection.matches(ev):
            return item
        try:
            item.identity = business_identity(self.s.identity_parts(ev))
            expected_key = route_key(ev.tenant, ev.target)
        except StreamschedError as exc:
            item.dead = ("bound", exc.kind)
            return item
        if rec.key != expected_key:
            # Keys route identities to partitions; a wrong key could put one identity on two owners.
            item.dead = ("misrouted", "record key is not the route key of its identity")
            item.identity = ""
        return item

    async def run_batch(self, records: list[Any]) -> None:
        items = [self._prepare(r) for r in records]
        self.metrics.inc("records", len(items))
        leaders: list[Item] = []
        seen: set[str] = set()
        for it in items:
            if not it.identity or it.dead is not None:
                continue
            if it.identity in seen:
                it.follower = True
                self.metrics.inc("duplicates_in_batch")
                continue
            seen.add(it.identity)
            leaders.append(it)
        self.metrics.inc("turns", len(leaders))
        if leaders:
            await self._wait_for_leases(leaders)
            await self._claim(leaders)
            await asyncio.gather(*(self._execute(it) for it in leaders))
        await self._resolve(items, leaders, records[-1].offset + 1)

    # --- 2/3. resolve + claim -------------------------------------------------------------------

    async def _wait_for_leases(self, leaders: list[Item]) -> None:
        """Honour unexpired leases of other owners (a predecessor that may still be executing)."""
        now = self.clock()
        expiries = [st.lease_expires_ns for st in (self.state.get(it.identity) for it in leaders)
                    if st.lease_active(now) and st.owner != self.owner]
        if expiries:
            self.metrics.inc("lease_waits", len(expiries))
            wait_s = min((max(expiries) - now) / 1e9, self.s.claim_duration_s) + 0.05
            await asyncio.sleep(wait_s)

    async def _send_state(self, st: ClaimState) -> Any:
        return await self.producer.send(self.s.state_topic, CLAIM_CODEC.encode(st.to_record()),
                                        key=st.identity.encode(), partition=self.partition)

    async def _abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.producer.abort_transaction()

    async def _claim(self, leaders: list[Item]) -> None:
        now = self.clock()
        duration = int(self.s.claim_duration_s * 1e9)
        await self.producer.begin_transaction()
        try:
            futures = []
            for it in leaders:
                cur = self.state.get(it.identity)
                it.state = cur.acquire(owner=self.owner, now_ns=now, duration_ns=duration,
                                       expected_revision=cur.revision)
                futures.append(await self._send_state(it.state))
            await asyncio.gather(*futures)
            await self.producer.commit_transaction()
        except BaseException:
            await self._abort()
            raise
        for it in leaders:
            assert it.state is not None
            self.state.put(it.state)
        self.metrics.inc("claims", len(leaders))
        failpoints.hit("after_claim")

    # --- 4. execute -------------------------------------------------------------------------------

    async def _execute(self, it: Item) -> None:
        st, ev = it.state, it.event
        assert st is not None and ev is not None
        if st.outcome is not None:
            self.metrics.inc("skipped_outcome")
            return
        deadline = st.lease_expires_ns
        attempt = ev.attempt
        while True:
            ctx = CommandContext(idempotency_key=it.identity, fence=st.fence, attempt=attempt,
                                 ordinal=st.ordinal, scheduled_ns=ev.due_ns, scheduler=self.s.name,
                                 schedule=ev.origin)
            commands = Commands(self.s.name, self.s.commands, ctx)
            remaining = max(0.001, (deadline - self.clock()) / 1e9)
            try:
                await asyncio.wait_for(self.s.handler(Turn(ev, ctx, commands)), remaining)
            except Exception as exc:
                failure = normalize_failure(exc, attempt=attempt, policy=self.retry, now_ns=self.clock())
                self.metrics.error(exc)
                delay = compute_backoff(self.retry, attempt, rand=self._rng.random())
                fits = self.clock() + int(delay * 1e9) < deadline
                if failure.retryable and delay <= IN_PLACE_RETRY_LIMIT_S and fits:
                    self.metrics.inc("retries")
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
                self.metrics.inc(f"terminal_{failure.cause_kind}")
                it.outcome = Outcome(OutcomeKind.FAILED, st.fence, self.clock(),
                                     error_kind=failure.cause_kind)
                it.dead = ("terminal", failure.cause_kind)
                break
            it.emits = list(commands._emits)
            it.outcome = Outcome(OutcomeKind.SUCCEEDED, st.fence, self.clock(), events=len(it.emits),
                                 digest=_digest(commands._results, it.emits))
            self.metrics.inc("executions")
            break
        failpoints.hit("after_effect")

    # --- 5/6. release + commit --------------------------------------------------------------------

    async def _resolve(self, items: list[Item], leaders: list[Item], next_offset: int) -> None:
        from aiokafka import TopicPartition

        p = self.producer
        await p.begin_transaction()
        try:
            stored = []
            for it in leaders:
                assert it.state is not None
                if it.outcome is not None:
                    it.state = it.state.store_outcome(fence=it.state.fence,
                                                      expected_revision=it.state.revision,
                                                      outcome=it.outcome)
                    stored.append(await self._send_state(it.state))
            await asyncio.gather(*stored)
            for _ in stored:
                failpoints.hit("after_outcome")
            futures = []
            for it in leaders:
                assert it.state is not None
                for emit in it.emits:
                    futures.append(await p.send(emit.topic, emit.value, key=emit.key))
                it.state = it.state.release(fence=it.state.fence, expected_revision=it.state.revision)
                futures.append(await self._send_state(it.state))
            for it in items:
                if it.dead is not None:
                    futures.append(await self._send_dead_letter(it))
            await asyncio.gather(*futures)
            for _ in leaders:
                failpoints.hit("after_release")
            await p.send_offsets_to_transaction(
                {TopicPartition(self.s.topic, self.partition): next_offset}, self.s.group)
            await p.commit_transaction()
        except BaseException:
            await self._abort()
            raise
        for it in leaders:
            assert it.state is not None
            self.state.put(it.state)
        dead = sum(1 for it in items if it.dead is not None)
        self.metrics.inc("releases", len(leaders))
        self.metrics.inc("dead_lettered", dead)
        self.metrics.inc("committed", len(items))
        self.metrics.set_gauge(f"committed_offset_p{self.partition}", next_offset)
        failpoints.hit("after_commit")

    async def _send_dead_letter(self, it: Item) -> Any:
        assert it.dead is not None
        kind, reason = it.dead
        rec = it.record
        attempt = it.event.attempt if it.event is not None else 1
        value = DEAD_LETTER_CODEC.encode({
            "kind": kind, "source_topic": self.s.topic, "source_partition": self.partition,
            "source_offset": rec.offset, "attempt": attempt, "at_ns": self.clock(),
            "reason": reason, "original": rec.value or b"", "original_key": rec.key,
        })
        headers = [
            ("ss-kind", kind.encode()), ("ss-source-topic", self.s.topic.encode()),
            ("ss-source-partition", str(self.partition).encode()),
            ("ss-source-offset", str(rec.offset).encode()), ("ss-attempt", str(attempt).encode()),
            ("ss-reason", reason.encode()),
        ]
        return await self.producer.send(self.s.dead_letter_topic, value, key=rec.key,
                                        partition=self.partition, headers=headers)


def _digest(results: list[object], emits: list[Emit]) -> bytes:
    h = hashlib.sha256()
    for r in results:
        try:
            h.update(json_dumps(r))
        except (DecodeError, TypeError):
            h.update(type(r).__name__.encode())
    for e in emits:
        h.update(e.topic.encode() + b"\x00" + e.value)
    return h.digest()
