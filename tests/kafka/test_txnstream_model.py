"""A hypothesis model of generations, members and shared transactions.

Two members of one group write through their own :class:`TxnStream` on the in-memory cluster. The
group coordinator is modelled as the broker checks a TxnOffsetCommit: the generation a round
sends must be the group's generation now, or the offsets are refused (``GenerationFenced``) and the
transaction can only abort. Rebalances bump the generation; a paused member (a zombie) keeps
believing the old one until it resumes, which may happen in the middle of its round.

Invariants, after every step:
* a record is visible only if the generation its round *began* in was the group's generation
  when the round committed (a zombie that rejoins mid-round never legitimises what it wrote);
* a round is all or nothing: every record written in it is visible, or none is;
* every committed round committed an offset of each partition it wrote for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from streamsched.errors import GenerationFenced
from streamsched.kafka.compat_offsets import GroupGeneration
from streamsched.kafka.txn import transaction
from streamsched.kafka.txnstream import TxnStream
from streamsched.testing.fake_cluster import FakeCluster
from streamsched.testing.fake_producer import FakeProducer

GROUP = "g"
PARTITIONS = 3
MEMBERS = ("a", "b")


class Group:
    def __init__(self) -> None:
        self.generation = 1
        self.believed = dict.fromkeys(MEMBERS, 1)
        self.paused: set[str] = set()

    def rebalance(self) -> None:
        self.generation += 1
        for m in MEMBERS:
            if m not in self.paused:
                self.believed[m] = self.generation

    def resume(self, member: str) -> None:
        self.paused.discard(member)
        self.believed[member] = self.generation  # it rejoins: a new, valid generation


class CheckedProducer(FakeProducer):
    """The group coordinator's check of a TxnOffsetCommit, on the in-memory producer."""

    def __init__(self, kafka: FakeCluster, tid: str, group: Group, stream: list[TxnStream]) -> None:
        super().__init__(kafka, tid)
        self.group = group
        self.stream = stream

    async def send_offsets_to_transaction(self, offsets: Mapping[Any, int], group_id: str) -> None:
        sent = self.stream[0].round_generation()
        if sent is None or sent.generation_id != self.group.generation:
            tp = min(offsets)
            raise GenerationFenced(tp.topic, tp.partition, group_id, sent.generation_id if sent else -1,
                                   "ILLEGAL_GENERATION")
        await super().send_offsets_to_transaction(offsets, group_id)


class Model(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.kafka = FakeCluster()
        self.kafka.create_topic("in", PARTITIONS)
        self.kafka.create_topic("out", PARTITIONS)
        self.group = Group()
        self.streams: dict[str, TxnStream] = {}
        for m in MEMBERS:
            holder: list[TxnStream] = []

            def make(m: str = m, holder: list[TxnStream] = holder) -> FakeProducer:
                return CheckedProducer(self.kafka, f"tid-{m}", self.group, holder)

            stream = TxnStream(make, GROUP, deadline_s=5.0,  # type: ignore[arg-type]
                               generation=lambda m=m: GroupGeneration(self.group.believed[m], m, None))
            holder.append(stream)
            self.streams[m] = stream
        self.rounds: list[tuple[list[bytes], bool]] = []
        """Per attempted write: its records, and whether it must be visible."""
        self.serial = 0

    def teardown(self) -> None:
        self.loop.close()

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @rule(member=st.sampled_from(MEMBERS), partitions=st.sets(st.integers(0, PARTITIONS - 1), min_size=1),
          event=st.sampled_from(["none", "rebalance", "resume", "pause", "fail"]))
    def write(self, member: str, partitions: set[int], event: str) -> None:
        """Ports of ``member`` for ``partitions`` write concurrently (one round); ``event``
        happens while their bodies are in flight."""
        stream = self.streams[member]
        began_at: dict[int, int] = {}
        values: dict[int, bytes] = {}
        gate = asyncio.Event()

        async def one(p: int) -> bool:
            port = stream.port([TopicPartition("in", p)])
            port.carry({TopicPartition("in", p): 0})
            self.serial += 1
            values[p] = b"%s-%d" % (member.encode(), self.serial)

            async def body() -> None:
                began_at[p] = self.group.believed[member]
                await port.send_and_wait("out", values[p], partition=p)
                await gate.wait()
                if event == "fail" and p == min(partitions):
                    raise ValueError("a write failed")

            try:
                await transaction(port, body, deadline_s=5.0)
                return True
            except Exception:  # noqa: BLE001 - the model checks what became visible
                return False

        async def scenario() -> list[bool]:
            tasks = [asyncio.ensure_future(one(p)) for p in sorted(partitions)]
            for _ in range(5):
                await asyncio.sleep(0)
            if event == "rebalance":
                self.group.rebalance()
            elif event == "resume":
                self.group.resume(member)
            elif event == "pause":
                self.group.paused.add(member)
                self.group.rebalance()
            gate.set()
            return list(await asyncio.gather(*tasks))

        committed = self._run(scenario())
        legit = all(began_at.get(p) == self.group.generation for p in partitions) and event != "fail"
        # Every port of one round succeeded or failed together.
        assert len(set(committed)) == 1, committed
        assert committed[0] == legit, (event, began_at, self.group.generation)
        self.rounds.append(([values[p] for p in sorted(partitions)], legit))

    @rule(member=st.sampled_from(MEMBERS))
    def pause(self, member: str) -> None:
        self.group.paused.add(member)
        self.group.rebalance()

    @rule(member=st.sampled_from(MEMBERS))
    def resume(self, member: str) -> None:
        self.group.resume(member)

    @invariant()
    def only_legit_rounds_are_visible_and_whole(self) -> None:
        visible = {r.value for r in self.kafka.records("out")}
        for records, legit in self.rounds:
            seen = [v in visible for v in records]
            assert all(seen) if legit else not any(seen), (records, legit)

    @invariant()
    def every_committed_round_committed_offsets(self) -> None:
        for txn in self.kafka.transactions:
            if txn.committed and txn.records:
                written = {r.partition for r in txn.records if r.topic == "out"}
                offsets = {tp.partition for tp in txn.offsets.get(GROUP, {})}
                assert written <= offsets


Model.TestCase.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
TestGenerationsMembersAndRounds = Model.TestCase
