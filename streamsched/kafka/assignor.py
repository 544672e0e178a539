"""A sticky partition assignor that keeps co-partitioned topics together.

Why: a group member (:mod:`streamsched.kafka.member`) owns partition *number* ``p`` of every
topic it subscribes to (the worker's transition and delay topics) through one fenced owner.
aiokafka's range assignor keeps such topics together but moves most partitions at every join or
leave; its sticky one balances topic-partitions singly and may split ``transitions[3]`` from
``delays[3]``. This one assigns partition numbers, deterministically (any leader, same result):

* **co-partitioned**: topics subscribed by exactly the same members form a *topic group*;
  partition ``p`` of each of its topics goes to one member (a topic with fewer partitions lacks
  some ``p``). Differing subscriptions (while a deployment changes one) give several groups,
  each shared among its own subscribers: nobody gets a topic it does not subscribe to;
* **balanced**: a group of ``n`` numbers gives each of its ``m`` members ``n // m`` or one more;
* **sticky**: a member's join metadata claims the numbers it was last assigned and the
  generation it got them in; a number claimed twice (a member that missed a rebalance) goes
  with the higher generation (equal: the lower member id). The ``n % m`` larger quotas go to
  the members holding most, each keeps ``min(held, quota)``, the rest goes in ascending blocks
  to those with fewest first (ties by member id): a fresh group gets range's layout.

aiokafka 0.14 never tells an assignor the group generation (nor calls ``on_generation_assignment``:
its sticky assignor always claims -1), so the leader stamps each assignment's userdata with one
more than the highest generation claimed in the join, and members keep that stamp.

aiokafka calls ``name``, ``metadata``, ``assign`` and ``on_assignment`` on whatever
``partition_assignment_strategy`` holds, checking no type; its own assignors are classes (its
sticky one keeps the claim in class attributes, shared by every consumer of a process). A claim
belongs to one consumer, so :func:`assignors` builds fresh duck-typed instances per consumer
(never share them); without subclassing, importing this module does not import aiokafka.

No fallback protocol: :func:`assignors` explains why aiokafka 0.14 cannot offer two. So a member
offering only range cannot join a group using this assignor (the broker refuses it with
``InconsistentGroupProtocol``), and moving a group between them means stopping every member
first, as upgrading to the release that brought this assignor requires anyway.

Userdata v1, big-endian: version byte, generation (uint32), claimed numbers as (start, length)
uint32 runs; an assignment's userdata is the header alone. Anything else (empty, another
version, a bad length, a run past int32 ids, over :data:`MAX_CLAIMED` numbers) is no claim.
"""

from __future__ import annotations

import logging
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import groupby
from typing import Protocol

from streamsched.kafka.protocols import TopicPartitionLike

__all__ = ["NAME", "NO_CLAIM", "Claim", "CoPartitionedStickyAssignor", "Member", "assignors",
           "decode_claim", "encode_claim", "plan"]

log = logging.getLogger(__name__)

NAME = "streamsched-copartitioned-sticky"
USERDATA_VERSION = 1
MAX_CLAIMED = 1 << 16
"""More numbers than this in one claim is garbage (bounds what a decode may allocate)."""
_HEADER = struct.Struct(">BI")
_RUN = struct.Struct(">II")
_MAX_GENERATION = 0xFFFF_FFFF


@dataclass(frozen=True)
class Claim:
    """The partition numbers a member was last assigned and the generation it got them in."""

    partitions: frozenset[int]
    generation: int


NO_CLAIM = Claim(frozenset(), -1)


@dataclass(frozen=True)
class Member:
    """One member as its join metadata describes it."""

    topics: frozenset[str]
    claim: Claim = NO_CLAIM


def encode_claim(claim: Claim) -> bytes:
    """``claim`` as join userdata (empty for no claim)."""
    if claim.generation < 0:
        return b""
    # Consecutive numbers share p - index: each such group is one run.
    numbered = enumerate(sorted(claim.partitions))
    runs = [[p for _, p in run] for _, run in groupby(numbered, lambda ip: ip[1] - ip[0])]
    header = _HEADER.pack(USERDATA_VERSION, min(claim.generation, _MAX_GENERATION))
    return header + b"".join(_RUN.pack(run[0], len(run)) for run in runs)


def decode_claim(data: bytes | None) -> Claim:
    """The claim in ``data``; :data:`NO_CLAIM` for anything but a well-formed version 1."""
    if not data or len(data) < _HEADER.size or (len(data) - _HEADER.size) % _RUN.size:
        return NO_CLAIM
    version, generation = _HEADER.unpack_from(data)
    if version != USERDATA_VERSION:
        return NO_CLAIM
    partitions: set[int] = set()
    for start, length in _RUN.iter_unpack(data[_HEADER.size:]):
        if length == 0 or start + length > 1 << 31 or len(partitions) + length > MAX_CLAIMED:
            return NO_CLAIM
        partitions.update(range(start, start + length))
    return Claim(frozenset(partitions), generation)


def plan(partitions: Mapping[str, AbstractSet[int]],
         members: Mapping[str, Member]) -> dict[str, dict[str, list[int]]]:
    """Member id -> topic -> sorted partitions, for every member (module docs). ``partitions``: each
    topic's partition ids; a subscribed topic missing from it (no metadata yet) is not assigned."""
    out: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for topic in sorted(partitions):
        subscribers = tuple(sorted(m for m, member in members.items() if topic in member.topics))
        if subscribers and partitions[topic]:
            groups[subscribers].append(topic)
    load = dict.fromkeys(members, 0)
    for subscribers, topics in sorted(groups.items()):
        units = sorted(set().union(*(partitions[t] for t in topics)))
        owners = _share(units, subscribers, {m: members[m].claim for m in subscribers}, load)
        for p, m in sorted(owners.items()):
            load[m] += 1
            for t in topics:
                if p in partitions[t]:
                    out[m].setdefault(t, []).append(p)
    return out


def _share(units: Sequence[int], ids: Sequence[str], claims: Mapping[str, Claim],
           load: Mapping[str, int]) -> dict[int, str]:
    """Number -> owner for one topic group: ``units`` ascending, ``ids`` sorted."""
    holder: dict[int, str] = {}
    present = set(units)
    for m in sorted(ids, key=lambda m: (-claims[m].generation, m)):  # a newer claim first
        for p in claims[m].partitions & present:
            holder.setdefault(p, m)
    held: dict[str, list[int]] = {m: [] for m in ids}
    for p in sorted(holder):
        held[holder[p]].append(p)
    base, extra = divmod(len(units), len(ids))
    # The one-more slots go to those holding most; then to the less loaded by earlier groups.
    ranked = sorted(ids, key=lambda m: (-min(len(held[m]), base + 1), load[m], m))
    quota = {m: base + (rank < extra) for rank, m in enumerate(ranked)}
    owners = {p: m for m in ids for p in held[m][:quota[m]]}
    free = iter(p for p in units if p not in owners)
    kept = {m: min(len(held[m]), quota[m]) for m in ids}
    for m in sorted(ids, key=lambda m: (kept[m], m)):
        for _ in range(quota[m] - kept[m]):
            owners[next(free)] = m
    return owners


class ClusterView(Protocol):
    """What an assignor reads of aiokafka's ``ClusterMetadata``."""

    def partitions_for_topic(self, topic: str) -> AbstractSet[int] | None: ...


class MemberMetadata(Protocol):
    """aiokafka's ``ConsumerProtocolMemberMetadata``: a member's join metadata."""

    subscription: Sequence[str]
    user_data: bytes | None


class MemberAssignment(Protocol):
    """aiokafka's ``ConsumerProtocolMemberAssignment``: what one member was assigned."""

    user_data: bytes | None

    def partitions(self) -> Sequence[TopicPartitionLike]: ...


class CoPartitionedStickyAssignor:
    """The co-partitioned sticky assignor of one consumer (see the module docs)."""

    name = NAME

    def __init__(self) -> None:
        self.claim = NO_CLAIM
        """What this member claims at its next join."""

    def metadata(self, topics: Iterable[str]) -> MemberMetadata:
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

        built: MemberMetadata = ConsumerProtocolMemberMetadata(0, sorted(topics), encode_claim(self.claim))
        return built

    def assign(self, cluster: ClusterView,
               members: Mapping[str, MemberMetadata]) -> dict[str, MemberAssignment]:
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        joined = {m: Member(frozenset(md.subscription), decode_claim(md.user_data))
                  for m, md in members.items()}
        partitions: dict[str, frozenset[int]] = {}
        for topic in sorted(set().union(*(member.topics for member in joined.values()))):
            found = cluster.partitions_for_topic(topic)
            if found:
                partitions[topic] = frozenset(found)
            else:
                log.warning("no partition metadata for topic %s; its partitions are not assigned", topic)
        # The stamp of this assignment: above every generation its members claim.
        generation = min(max((j.claim.generation for j in joined.values()), default=-1) + 1, _MAX_GENERATION)
        planned = plan(partitions, joined)
        stayed = sum(len(joined[m].claim.partitions & set().union(*planned[m].values())) for m in planned)
        log.info("sticky assignment, stamp %d: %d members, %d partition numbers kept by their owner",
                 generation, len(joined), stayed)
        userdata = _HEADER.pack(USERDATA_VERSION, generation)
        return {m: ConsumerProtocolMemberAssignment(0, sorted(planned[m].items()), userdata)
                for m in members}

    def on_assignment(self, assignment: MemberAssignment) -> None:
        """Remember the assigned numbers as this member's claim, under the leader's stamp (one
        more than its last claim if the userdata has none it can read, e.g. a later version's)."""
        stamp = decode_claim(assignment.user_data).generation
        self.claim = Claim(frozenset(tp.partition for tp in assignment.partitions()),
                           min(max(stamp, self.claim.generation + 1), _MAX_GENERATION))


def assignors() -> tuple[CoPartitionedStickyAssignor]:
    """``partition_assignment_strategy`` for ONE consumer (a fresh instance holds its claim).

    This assignor alone: aiokafka 0.14 sends one JoinGroup per listed assignor (the first with
    the first protocol, the next with two...), and a member whose protocols change between its
    joins makes the broker start another rebalance, so a second entry (range, as a fallback)
    keeps the group rebalancing for ever (on a real broker: no stable generation in minutes)."""
    return (CoPartitionedStickyAssignor(),)
