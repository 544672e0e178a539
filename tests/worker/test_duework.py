"""Unit, property and stateful tests for streamsched.duework (pure logic, no broker)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streamsched.errors import BoundExceeded, ConfigError, InvalidDueItem, StreamschedError
from streamsched.model import limits
from streamsched.worker.duework import DueIndex, DueItem, DueKind

END = 2**64 - 1  # the latest representable due time: sweeping at END drains everything


def item(key: str, partition: int = 0, due_ns: int = 0, kind: DueKind = "due", attempt: int = 1) -> DueItem:
    return DueItem(key=key, partition=partition, due_ns=due_ns, kind=kind, attempt=attempt)


def fill(index: DueIndex, partition: int, count: int, due_ns: int = 0, prefix: str | None = None) -> None:
    name = prefix if prefix is not None else f"p{partition}"
    for i in range(count):
        assert index.add(item(f"{name}-{i}", partition, due_ns))


def per_partition(page: list[DueItem]) -> Counter[int]:
    return Counter(it.partition for it in page)


# ----------------------------------------------------------------------------------- validation


def test_defaults() -> None:
    index = DueIndex()
    assert index.max_items == 10_000 == limits.DEFAULT_DUE_INDEX_ITEMS
    assert index.page_size == 32 == limits.MAX_SWEEP_PAGE
    assert len(index) == 0
    assert index.free == 10_000
    assert not index.full
    assert index.next_due_ns() is None
    assert index.partitions() == ()
    assert index.sweep(END) == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_items": 0}, BoundExceeded),
        ({"max_items": limits.MAX_DUE_INDEX_ITEMS + 1}, BoundExceeded),
        ({"max_items": 1.5}, ConfigError),
        ({"max_items": True}, ConfigError),
        ({"page_size": 0}, BoundExceeded),
        ({"page_size": limits.MAX_SWEEP_PAGE + 1}, BoundExceeded),
        ({"page_size": "8"}, ConfigError),
    ],
)
def test_index_options_are_bounded(kwargs: dict[str, Any], error: type[StreamschedError]) -> None:
    with pytest.raises(error):
        DueIndex(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": ""}, InvalidDueItem),
        ({"key": 5}, InvalidDueItem),
        ({"key": "k" * (limits.MAX_DUE_KEY_LENGTH + 1)}, BoundExceeded),
        ({"partition": -1}, BoundExceeded),
        ({"partition": 1.0}, InvalidDueItem),
        ({"due_ns": -1}, BoundExceeded),
        ({"due_ns": 2**64}, BoundExceeded),
        ({"due_ns": 1.0}, InvalidDueItem),
        ({"due_ns": False}, InvalidDueItem),
        ({"kind": "later"}, InvalidDueItem),
        ({"attempt": -1}, BoundExceeded),
        ({"attempt": "1"}, InvalidDueItem),
    ],
)
def test_item_fields_are_validated(kwargs: dict[str, Any], error: type[StreamschedError]) -> None:
    fields: dict[str, Any] = {"key": "k", "partition": 0, "due_ns": 0, "kind": "due", "attempt": 1}
    fields.update(kwargs)
    with pytest.raises(error):
        DueItem(**fields)


def test_item_is_frozen_and_ref_is_opaque() -> None:
    unhashable = {"offset": 7}
    it = DueItem("k", 0, 5, "retry", 2, ref=unhashable)
    assert it.ref is unhashable
    with pytest.raises(AttributeError):
        it.due_ns = 6  # type: ignore[misc]
    index = DueIndex()
    assert index.add(it)
    assert index.sweep(5)[0].ref is unhashable


def test_sweep_arguments_are_validated() -> None:
    index = DueIndex()
    with pytest.raises(BoundExceeded):
        index.sweep(0, deadline_items=-1)
    with pytest.raises(ConfigError):
        index.sweep(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        index.add(("k", 0, 0))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- paging


def test_pages_are_bounded_to_32() -> None:
    index = DueIndex()
    fill(index, 0, 100)
    sizes = []
    while page := index.sweep(0):
        sizes.append(len(page))
    assert sizes == [32, 32, 32, 4]
    assert len(index) == 0


def test_only_due_items_are_swept_earliest_first() -> None:
    index = DueIndex()
    for due in (50, 10, 30, 20, 40):
        index.add(item(f"k{due}", 0, due))
    assert [it.due_ns for it in index.sweep(30)] == [10, 20, 30]
    assert index.sweep(39) == []
    assert [it.due_ns for it in index.sweep(END)] == [40, 50]


def test_equal_due_times_come_out_in_insertion_order() -> None:
    index = DueIndex(page_size=8)
    keys = [f"k{i}" for i in (5, 3, 9, 1, 7)]
    for key in keys:
        index.add(item(key, 0, 100))
    assert [it.key for it in index.sweep(100)] == keys


def test_deadline_items_caps_a_page() -> None:
    index = DueIndex()
    fill(index, 0, 10)
    assert index.sweep(0, deadline_items=0) == []
    assert len(index.sweep(0, deadline_items=3)) == 3
    assert len(index.sweep(0, deadline_items=1000)) == 7  # still capped by page_size/availability


# ------------------------------------------------------------------------------------ fairness


def test_skewed_partitions_all_get_served_in_the_first_page() -> None:
    index = DueIndex()
    fill(index, 0, 1000)
    fill(index, 1, 10)
    fill(index, 2, 3)
    first = index.sweep(0)
    assert len(first) == 32
    # Round-robin: 3 rounds of three, 7 more rounds of two, then partition 0 alone.
    assert per_partition(first) == {0: 19, 1: 10, 2: 3}
    # Earliest-first (here: insertion order) within each partition.
    assert [it.key for it in first if it.partition == 1] == [f"p1-{i}" for i in range(10)]
    assert per_partition(index.sweep(0)) == {0: 32}


def test_a_hot_partition_gets_one_slot_per_round() -> None:
    index = DueIndex()
    fill(index, 7, 1_000)
    fill(index, 3, 1_000)
    page = index.sweep(0)
    assert per_partition(page) == {3: 16, 7: 16}
    assert [it.partition for it in page[:4]] == [3, 7, 3, 7]


def test_rotation_resumes_after_the_partition_served_last() -> None:
    index = DueIndex()
    for p in range(3):
        fill(index, p, 100)
    first = index.sweep(0)
    assert per_partition(first) == {0: 11, 1: 11, 2: 10}
    assert first[-1].partition == 1
    second = index.sweep(0)
    assert second[0].partition == 2
    assert per_partition(second) == {2: 11, 0: 11, 1: 10}
    third = index.sweep(0)
    assert third[0].partition == 1
    totals = per_partition(first + second + third)
    assert totals == {0: 32, 1: 32, 2: 32}


def test_rotation_survives_a_revoked_last_partition() -> None:
    index = DueIndex(page_size=2)
    for p in (1, 2, 3):
        fill(index, p, 5)
    assert [it.partition for it in index.sweep(0)] == [1, 2]
    index.remove_partition(2)
    assert [it.partition for it in index.sweep(0)] == [3, 1]


def test_rotation_wraps_to_the_lowest_partition() -> None:
    index = DueIndex(page_size=1)
    for p in (4, 9):
        fill(index, p, 3)
    assert [index.sweep(0)[0].partition for _ in range(4)] == [4, 9, 4, 9]


def test_not_yet_due_partition_does_not_take_a_slot() -> None:
    index = DueIndex(page_size=4)
    fill(index, 0, 10, due_ns=0)
    fill(index, 1, 10, due_ns=100)
    assert per_partition(index.sweep(50)) == {0: 4}


# ------------------------------------------------------------------------------ memory bound


def test_full_index_refuses_and_free_recovers_after_sweep() -> None:
    index = DueIndex(max_items=5, page_size=2)
    fill(index, 0, 5)
    assert index.full
    assert index.free == 0
    refused = item("extra", 1, 0)
    assert index.add(refused) is False
    assert len(index) == 5
    assert "extra" not in index
    assert index.partitions() == (0,)
    assert len(index.sweep(0)) == 2
    assert not index.full
    assert index.free == 2
    assert index.add(refused)
    assert index.free == 1


def test_replacing_a_key_is_accepted_when_full() -> None:
    index = DueIndex(max_items=2)
    index.add(item("a", 0, 10))
    index.add(item("b", 0, 20))
    assert index.full
    assert index.add(item("a", 1, 99, kind="retry", attempt=2))
    assert len(index) == 2
    assert index.get("a") == item("a", 1, 99, kind="retry", attempt=2)


def test_lazy_deletion_garbage_is_compacted() -> None:
    index = DueIndex()
    fill(index, 0, 100)
    for i in range(0, 100, 2):
        index.remove(f"p0-{i}")
        assert index.footprint <= 2 * len(index)
    for i in range(1, 100, 2):
        index.add(item(f"p0-{i}", 0, 5))  # replacements leave garbage too
        assert index.footprint <= 2 * len(index)
    assert len(index) == 50
    index.sweep(END)
    assert index.footprint <= 2 * len(index)


# ------------------------------------------------------------------------ replace and remove


def test_replace_keeps_the_new_item_even_when_later() -> None:
    index = DueIndex()
    index.add(item("a", 0, 10, attempt=1))
    index.add(item("a", 0, 50, attempt=2))
    assert len(index) == 1
    assert index.next_due_ns() == 50
    assert index.sweep(20) == []
    assert index.sweep(50) == [item("a", 0, 50, attempt=2)]
    assert index.sweep(END) == []


def test_replace_keeps_the_new_item_when_earlier_or_in_another_partition() -> None:
    index = DueIndex()
    index.add(item("a", 0, 50))
    index.add(item("a", 3, 10, kind="lease"))
    assert index.partitions() == (3,)
    assert index.next_due_ns() == 10
    assert index.sweep(END) == [item("a", 3, 10, kind="lease")]


def test_remove() -> None:
    index = DueIndex()
    index.add(item("a", 0, 10))
    index.add(item("b", 0, 20))
    assert index.remove("a") is True
    assert index.remove("a") is False
    assert index.remove("never") is False
    assert index.next_due_ns() == 20
    assert index.sweep(END) == [item("b", 0, 20)]
    assert index.partitions() == ()


def test_remove_partition() -> None:
    index = DueIndex()
    fill(index, 0, 4, due_ns=5)
    fill(index, 1, 3, due_ns=7)
    index.remove("p1-0")
    assert index.remove_partition(1) == 2
    assert index.remove_partition(1) == 0
    assert index.remove_partition(42) == 0
    assert index.partitions() == (0,)
    assert len(index) == 4
    assert "p1-1" not in index
    assert index.next_due_ns() == 5
    assert index.add(item("p1-1", 1, 1))  # the key is free again
    assert item("p1-1", 1, 1) in index.sweep(END)


def test_next_due_ns_skips_removed_and_swept_items() -> None:
    index = DueIndex(page_size=1)
    assert index.next_due_ns() is None
    index.add(item("a", 0, 30))
    index.add(item("b", 1, 10))
    index.add(item("c", 1, 20))
    assert index.next_due_ns() == 10
    index.remove("b")
    assert index.next_due_ns() == 20
    assert index.sweep(25) == [item("c", 1, 20)]
    assert index.next_due_ns() == 30
    index.sweep(30)
    assert index.next_due_ns() is None


# ---------------------------------------------------------------------- fairness property


@settings(max_examples=60, deadline=None)
@given(data=st.data(), page_size=st.integers(1, limits.MAX_SWEEP_PAGE))
def test_full_partitions_share_a_page_evenly(data: st.DataObject, page_size: int) -> None:
    k = data.draw(st.integers(1, 12), label="k")
    parts = data.draw(st.lists(st.integers(0, 500), min_size=k, max_size=k, unique=True), label="parts")
    index = DueIndex(page_size=page_size)
    for p in parts:
        count = data.draw(st.integers(page_size, 3 * page_size), label=f"count {p}")
        fill(index, p, count, due_ns=data.draw(st.integers(0, 5)))
    # Earlier sweeps (possibly partial pages) move the rotation start to an arbitrary partition.
    for _ in range(data.draw(st.integers(0, 3), label="earlier sweeps")):
        index.sweep(END, deadline_items=data.draw(st.integers(0, page_size)))
    # Top up so that every partition holds at least page_size due items again.
    for p in parts:
        fill(index, p, page_size, due_ns=0, prefix=f"top{p}")
    page = index.sweep(END)
    assert len(page) == page_size
    counts = per_partition(page)
    if page_size >= k:
        assert set(counts) == set(parts)
    full_counts = [counts.get(p, 0) for p in parts]
    assert max(full_counts) - min(full_counts) <= 1


# ------------------------------------------------------------------------ stateful model


class DueIndexMachine(RuleBasedStateMachine):
    """DueIndex against a plain list of (token, item) in insertion order."""

    def __init__(self) -> None:
        super().__init__()
        self.index = DueIndex()
        self.model: list[tuple[int, DueItem]] = []
        self.tokens = 0
        self.returned: set[int] = set()

    @initialize(max_items=st.integers(1, 12), page_size=st.integers(1, 5))
    def setup(self, max_items: int, page_size: int) -> None:
        self.index = DueIndex(max_items=max_items, page_size=page_size)

    def _find(self, key: str) -> int | None:
        return next((i for i, (_, it) in enumerate(self.model) if it.key == key), None)

    @rule(
        key=st.sampled_from([f"k{i}" for i in range(16)]),
        partition=st.integers(0, 3),
        due_ns=st.integers(0, 100),
        kind=st.sampled_from(["retry", "due", "lease"]),
        attempt=st.integers(0, 3),
    )
    def add(self, key: str, partition: int, due_ns: int, kind: DueKind, attempt: int) -> None:
        self.tokens += 1
        new = DueItem(key, partition, due_ns, kind, attempt, ref=self.tokens)
        at = self._find(key)
        accepted = self.index.add(new)
        if at is None and len(self.model) >= self.index.max_items:
            assert accepted is False
            return
        assert accepted is True
        if at is not None:
            del self.model[at]
        self.model.append((self.tokens, new))

    @rule(key=st.sampled_from([f"k{i}" for i in range(16)]))
    def remove(self, key: str) -> None:
        at = self._find(key)
        assert self.index.remove(key) is (at is not None)
        if at is not None:
            del self.model[at]

    @rule(partition=st.integers(0, 4))
    def remove_partition(self, partition: int) -> None:
        expected = sum(1 for _, it in self.model if it.partition == partition)
        assert self.index.remove_partition(partition) == expected
        self.model = [(t, it) for t, it in self.model if it.partition != partition]

    def _check_page(self, now_ns: int, limit: int, page: list[DueItem]) -> None:
        assert len(page) <= limit <= self.index.page_size
        tokens = [it.ref for it in page]
        assert len(set(tokens)) == len(tokens)
        live = {t: it for t, it in self.model}
        for it in page:
            assert isinstance(it.ref, int)
            assert it.due_ns <= now_ns, "swept an item that is not due yet"
            assert it.ref not in self.returned, "swept an item twice"
            assert live.get(it.ref) == it, "swept an item that was removed or replaced"
            self.returned.add(it.ref)
        self.model = [(t, it) for t, it in self.model if t not in set(tokens)]
        still_due = [it for _, it in self.model if it.due_ns <= now_ns]
        if len(page) < limit:
            assert still_due == [], "short page although due work remained"
        # Earliest-due first within a partition (ties in insertion order).
        for it in page:
            for _, rest in self.model:
                if rest.partition == it.partition:
                    assert rest.due_ns >= it.due_ns
        # Round-robin: partitions still holding due work got m or m + 1 items, nobody more.
        counts = per_partition(page)
        unexhausted = {it.partition for it in still_due}
        if unexhausted and page:
            low = min(counts.get(p, 0) for p in unexhausted)
            assert max(counts.values()) <= low + 1

    @rule(now_ns=st.integers(0, 120), deadline=st.none() | st.integers(0, 6))
    def sweep(self, now_ns: int, deadline: int | None) -> None:
        limit = self.index.page_size if deadline is None else min(self.index.page_size, deadline)
        page = self.index.sweep(now_ns, deadline_items=deadline)
        self._check_page(now_ns, limit, page)

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def drain(self) -> None:
        self._drain()

    def _drain(self) -> None:
        expected = {t for t, _ in self.model}
        got: set[int] = set()
        for _ in range(len(self.model) + 1):
            page = self.index.sweep(END)
            if not page:
                break
            got |= {it.ref for it in page}  # type: ignore[misc]
            self._check_page(END, self.index.page_size, page)
        assert got == expected
        assert self.model == []
        assert len(self.index) == 0

    @invariant()
    def sizes_match(self) -> None:
        assert len(self.index) == len(self.model) <= self.index.max_items
        assert self.index.free == self.index.max_items - len(self.model)
        assert self.index.full is (len(self.model) >= self.index.max_items)
        assert self.index.footprint <= 2 * len(self.index)

    @invariant()
    def views_match(self) -> None:
        assert self.index.partitions() == tuple(sorted({it.partition for _, it in self.model}))
        expected_next = min((it.due_ns for _, it in self.model), default=None)
        assert self.index.next_due_ns() == expected_next
        for _, it in self.model:
            assert it.key in self.index
            assert self.index.get(it.key) == it

    def teardown(self) -> None:
        self._drain()


DueIndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_due_index_state_machine = DueIndexMachine.TestCase
