"""The co-partitioned sticky assignor without a broker (streamsched/kafka/assignor.py).

Properties over random groups (1-12 members, 1-1200 partition numbers, one to three topics),
random previous claims (none, a valid assignment, conflicting and stale ones, garbage userdata):
every partition assigned exactly once, partition ``p`` of every topic with one member, balanced,
and sticky as far as balance allows. The aiokafka side (join metadata and assignments through
aiokafka's own structs) runs here too; the real group is tests/kafka/test_assignor_kafka.py.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.kafka.assignor import (
    NAME,
    NO_CLAIM,
    Claim,
    CoPartitionedStickyAssignor,
    Member,
    assignors,
    decode_claim,
    encode_claim,
    plan,
)

Plan = dict[str, dict[str, list[int]]]
PROPERTY = settings(deadline=None, max_examples=60)
SEEDS = st.integers(0, 2**32 - 1)
"""Bulk random choices (previous claims of up to 1200 partitions) come from a seeded Random."""


def ids(count: int) -> list[str]:
    return [f"member-{i:02d}" for i in range(count)]


def numbers(out: Plan) -> dict[str, set[int]]:
    """Member -> the partition numbers it got (of any topic)."""
    return {m: {p for parts in topics.values() for p in parts} for m, topics in out.items()}


def check_assignment(partitions: Mapping[str, AbstractSet[int]], members: Mapping[str, Member],
                     out: Plan) -> None:
    """Each partition of each subscribed topic exactly once, to a subscriber; topics with the same
    subscribers co-partitioned; each topic group balanced."""
    assert set(out) == set(members)
    owner: dict[tuple[str, int], str] = {}
    for m, topics in out.items():
        for t, parts in topics.items():
            assert t in members[m].topics, f"{m} got {t} it does not subscribe to"
            assert parts == sorted(parts)
            for p in parts:
                assert (t, p) not in owner, f"{t}[{p}] assigned twice"
                owner[t, p] = m
    subscribed = {t for member in members.values() for t in member.topics}
    assert set(owner) == {(t, p) for t in subscribed & set(partitions) for p in partitions[t]}
    groups: dict[frozenset[str], list[str]] = {}
    for t in sorted(subscribed & set(partitions)):
        groups.setdefault(frozenset(m for m in members if t in members[m].topics), []).append(t)
    for subscribers, grouped in groups.items():
        per_number = {p: {owner[t, p] for t in grouped if p in partitions[t]}
                      for p in set().union(*(partitions[t] for t in grouped))}
        assert all(len(who) == 1 for who in per_number.values()), "partition p of a topic group split"
        counts = [sum(1 for who in per_number.values() if m in who) for m in subscribers]
        n, k = len(per_number), len(subscribers)
        assert set(counts) <= {n // k, -(-n // k)}, f"unbalanced: {sorted(counts)} for {n} over {k}"


def winners(claims: Mapping[str, Claim], units: AbstractSet[int]) -> dict[str, set[int]]:
    """What each member validly holds: each claimed number goes with its newest claim (equal
    generations: the lowest member id)."""
    held: dict[str, set[int]] = {m: set() for m in claims}
    for p in units:
        claimants = [m for m, c in claims.items() if p in c.partitions]
        if claimants:
            held[min(claimants, key=lambda m: (-claims[m].generation, m))].add(p)
    return held


def random_claims(rng: random.Random, members: list[str], n: int, kind: str) -> dict[str, Claim]:
    """Previous claims as they come through the userdata codec (garbage included)."""
    raw: dict[str, bytes] = {}
    for m in members:
        if kind == "none":
            raw[m] = b""
        elif kind == "garbage":
            raw[m] = rng.randbytes(rng.randrange(0, 40))
        else:  # conflicting: random subsets (some past n: partitions since gone), random generations
            density = rng.random()
            picked = {p for p in range(n + 5) if rng.random() < density}
            raw[m] = encode_claim(Claim(frozenset(picked), rng.randrange(0, 4)))
    return {m: decode_claim(data) for m, data in raw.items()}


def one_group(topic_count: int, n: int) -> dict[str, frozenset[int]]:
    return {f"topic-{i}": frozenset(range(n)) for i in range(topic_count)}


def with_claims(member_ids: list[str], topics: AbstractSet[str],
                claims: Mapping[str, Claim]) -> dict[str, Member]:
    return {m: Member(frozenset(topics), claims.get(m, NO_CLAIM)) for m in member_ids}


@PROPERTY
@given(st.integers(1, 12), st.integers(1, 1200), st.integers(1, 3),
       st.sampled_from(["none", "conflicting", "garbage"]), SEEDS)
def test_every_partition_once_copartitioned_and_balanced(count: int, n: int, topic_count: int, kind: str,
                                                          seed: int) -> None:
    rng = random.Random(seed)
    partitions = one_group(topic_count, n)
    members = with_claims(ids(count), set(partitions), random_claims(rng, ids(count), n, kind))
    out = plan(partitions, members)
    check_assignment(partitions, members, out)
    assert out == plan(partitions, dict(reversed(members.items()))), "depends on the members' order"


@PROPERTY
@given(st.integers(1, 12), st.integers(1, 1200), SEEDS)
def test_each_member_keeps_what_balance_allows_and_newer_claims_win(count: int, n: int,
                                                                    seed: int) -> None:
    rng = random.Random(seed)
    claims = random_claims(rng, ids(count), n, "conflicting")
    partitions = one_group(2, n)
    out = numbers(plan(partitions, with_claims(ids(count), set(partitions), claims)))
    held = winners(claims, set(range(n)))
    for m in ids(count):
        assert len(out[m] & held[m]) == min(len(held[m]), len(out[m])), f"{m} lost more than balance needs"
    base, extra = divmod(n, count)
    above = sum(len(h) > base for h in held.values())
    best = sum(min(len(h), base) for h in held.values()) + min(extra, above)  # the most any balance keeps
    assert sum(len(out[m] & held[m]) for m in ids(count)) == best
    # A member that lost a conflict never keeps the number at the newer claimant's expense.
    for m in ids(count):
        for p in out[m] & claims[m].partitions - held[m]:
            winner = next(w for w, h in held.items() if p in h)
            assert len(out[winner]) == len(out[winner] & held[winner]) < len(held[winner])


def random_balanced(rng: random.Random, members: list[str], n: int, generation: int) -> dict[str, Claim]:
    """A valid balanced assignment of ``n`` numbers (scattered: not any assignor's layout), as claims."""
    shuffled, order = rng.sample(range(n), n), rng.sample(members, len(members))
    base, extra = divmod(n, len(members))
    claims, start = {}, 0
    for rank, m in enumerate(order):
        size = base + (rank < extra)
        claims[m] = Claim(frozenset(shuffled[start:start + size]), generation)
        start += size
    return claims


@PROPERTY
@given(st.integers(1, 12), st.integers(1, 1200), SEEDS)
def test_a_valid_previous_assignment_of_the_same_members_moves_nothing(count: int, n: int,
                                                                       seed: int) -> None:
    claims = random_balanced(random.Random(seed), ids(count), n, 7)
    partitions = one_group(2, n)
    again = numbers(plan(partitions, with_claims(ids(count), set(partitions), claims)))
    assert again == {m: set(c.partitions) for m, c in claims.items()}


@PROPERTY
@given(st.integers(1, 11), st.integers(1, 1200), SEEDS)
def test_a_joining_member_takes_at_most_its_share_and_a_leaving_one_moves_only_its_own(
        count: int, n: int, seed: int) -> None:
    rng = random.Random(seed)
    partitions = one_group(2, n)
    claims = random_balanced(rng, ids(count), n, 3)
    claims[ids(count + 1)[-1]] = NO_CLAIM  # the new member
    before = {m: set(c.partitions) for m, c in claims.items()}
    grown = numbers(plan(partitions, with_claims(ids(count + 1), set(partitions), claims)))
    moved = sum(len(ps - before[m]) for m, ps in grown.items())
    assert moved == len(grown[ids(count + 1)[-1]]) <= math.ceil(n / (count + 1))
    if count > 1:
        gone = rng.choice(ids(count))
        staying = [m for m in ids(count) if m != gone]
        shrunk = numbers(plan(partitions, with_claims(staying, set(partitions), claims)))
        assert all(before[m] <= ps for m, ps in shrunk.items()), "a staying member lost a partition"
        assert set().union(*shrunk.values()) == set(range(n))


def test_a_stale_claim_loses_to_the_newer_one() -> None:
    partitions = one_group(2, 6)
    members = {"a": Member(frozenset(partitions), Claim(frozenset({0, 1, 2}), 5)),
               "b": Member(frozenset(partitions), Claim(frozenset({3, 4, 5}), 5)),
               "stale": Member(frozenset(partitions), Claim(frozenset({0, 1, 3, 4}), 2))}
    got = numbers(plan(partitions, members))
    assert got["a"] <= {0, 1, 2} and got["b"] <= {3, 4, 5} and len(got["stale"]) == 2
    members["stale"] = Member(frozenset(partitions), Claim(frozenset({0, 1}), 9))  # now the newest
    assert numbers(plan(partitions, members))["stale"] == {0, 1}


def test_topics_with_fewer_partitions_lack_some_numbers() -> None:
    partitions = {"transitions": frozenset(range(6)), "delays": frozenset(range(4))}
    members = with_claims(ids(2), set(partitions), {})
    out = plan(partitions, members)
    check_assignment(partitions, members, out)
    assert out == {"member-00": {"delays": [0, 1, 2], "transitions": [0, 1, 2]},
                   "member-01": {"delays": [3], "transitions": [3, 4, 5]}}


@PROPERTY
@given(st.integers(1, 8), st.lists(st.integers(1, 40), min_size=1, max_size=4), SEEDS)
def test_differing_subscriptions_only_get_subscribed_topics(count: int, sizes: list[int],
                                                            seed: int) -> None:
    rng = random.Random(seed)
    partitions = {f"topic-{i}": frozenset(range(size)) for i, size in enumerate(sizes)}
    names = [*sorted(partitions), "no-metadata"]
    claims = random_claims(rng, ids(count), max(sizes), rng.choice(["none", "conflicting"]))
    members = {m: Member(frozenset(rng.sample(names, rng.randint(1, len(names)))), claims[m])
               for m in ids(count)}
    check_assignment(partitions, members, plan(partitions, members))


def test_a_fresh_group_gets_ranges_layout() -> None:
    partitions = one_group(2, 14)
    members = with_claims(ids(4), set(partitions), {})
    ranged = RangePartitionAssignor.assign(Cluster(partitions), {
        m: ConsumerProtocolMemberMetadata(0, sorted(partitions), b"") for m in members})
    assert plan(partitions, members) == {m: dict(a.assignment) for m, a in ranged.items()}


@given(st.binary(max_size=200))
def test_garbage_userdata_is_no_claim_never_an_error(data: bytes) -> None:
    claim = decode_claim(data)
    assert claim == NO_CLAIM or (claim.generation >= 0 and all(0 <= p < 1 << 31 for p in claim.partitions))


@given(st.frozensets(st.integers(0, 5000), max_size=300), st.integers(0, 2**32 - 1))
def test_claims_round_trip(partitions: frozenset[int], generation: int) -> None:
    claim = Claim(partitions, generation)
    assert decode_claim(encode_claim(claim)) == claim
    assert len(encode_claim(Claim(frozenset(range(1200)), generation))) == 13  # one run
    assert encode_claim(NO_CLAIM) == b"" and decode_claim(None) == NO_CLAIM
    assert decode_claim(b"\x02" + encode_claim(claim)[1:]) == NO_CLAIM  # an unknown version


class Cluster:
    """The part of aiokafka's ClusterMetadata an assignor reads."""

    def __init__(self, partitions: Mapping[str, AbstractSet[int]]) -> None:
        self._partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        found = self._partitions.get(topic)
        return None if found is None else set(found)


def rejoin(consumers: Mapping[str, CoPartitionedStickyAssignor], cluster: Cluster, topics: list[str]) -> Plan:
    """One join through aiokafka's wire structs, as aiokafka's coordinator drives it."""
    wire: dict[str, Any] = {m: a.metadata(set(topics)) for m, a in consumers.items()}
    joined = {m: ConsumerProtocolMemberMetadata.decode(md.encode()) for m, md in wire.items()}
    assigned: dict[str, Any] = consumers[min(consumers)].assign(cluster, joined)  # by the leader
    sent = {m: ConsumerProtocolMemberAssignment.decode(a.encode()) for m, a in assigned.items()}
    for m, assignment in sent.items():
        consumers[m].on_assignment(assignment)
    return {m: dict(a.assignment) for m, a in sent.items()}


def test_through_aiokafkas_structs_claims_and_generations_carry_over() -> None:
    topics = ["transitions", "delays"]
    cluster = Cluster({t: frozenset(range(12)) for t in topics})
    consumers = {m: CoPartitionedStickyAssignor() for m in ids(2)}
    first = rejoin(consumers, cluster, topics)
    assert [consumers[m].claim for m in ids(2)] == [Claim(frozenset(range(6)), 0),
                                                     Claim(frozenset(range(6, 12)), 0)]
    consumers["member-02"] = CoPartitionedStickyAssignor()
    second = rejoin(consumers, cluster, topics)
    assert {m: c.claim.generation for m, c in consumers.items()} == dict.fromkeys(ids(3), 1)
    for m in ids(2):
        kept = set(second[m]["transitions"]) & set(first[m]["transitions"])
        assert len(kept) == 4 and second[m]["delays"] == second[m]["transitions"]
    del consumers["member-00"]  # it leaves; the rest keep everything
    third = rejoin(consumers, cluster, topics)
    assert all(set(second[m]["transitions"]) <= set(third[m]["transitions"]) for m in consumers)


def test_each_consumer_gets_its_own_assignor_and_no_second_protocol() -> None:
    """A second entry (range, as a fallback) would make aiokafka 0.14 send two JoinGroups with
    different protocols at every join, which keeps the group rebalancing (module docs)."""
    first, second = assignors(), assignors()
    assert [a.name for a in first] == [NAME] and first[0] is not second[0]
    first[0].on_assignment(ConsumerProtocolMemberAssignment(0, [("transitions", [1, 2])], b"garbage"))
    first[0].on_assignment(ConsumerProtocolMemberAssignment(0, [("transitions", [1, 3])], b""))
    assert first[0].claim == Claim(frozenset({1, 3}), 1) and second[0].claim == NO_CLAIM


def test_importing_the_assignor_does_not_import_aiokafka() -> None:
    code = "import sys, streamsched.kafka.assignor; assert 'aiokafka' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
