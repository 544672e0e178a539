"""Transactional ids (streamsched.model.names): distinct owners never share an id, and the
PREFIXED ACL of one owner never matches another owner's ids.

The old format ``streamsched.<group>.<topic>.<p>`` failed both: group ``a.b``/topic ``c`` and group
``a``/topic ``b.c`` got the same ids (they would fence each other), and group ``a``'s prefix
``streamsched.a.`` also matched every id of group ``a.b``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import InvalidName
from streamsched.model.names import (
    TXN_SEPARATOR,
    member_transactional_id,
    transactional_id,
    transactional_prefix,
)

# A small alphabet with every separator-like character of the name grammar makes near-collisions
# (``a.b``+``c`` vs ``a``+``b.c``) frequent.
names = st.text(alphabet="ab.-_0", min_size=1, max_size=6)
partitions = st.integers(min_value=0, max_value=10_000)
owners = st.one_of(st.tuples(st.just("scheduler"), names, names), st.tuples(st.just("ticker"), names))


def _id(owner: tuple[str, ...], p: int) -> str:
    return transactional_id(owner[0], *owner[1:], partition=p)


def test_the_old_formats_collisions_are_gone() -> None:
    assert (transactional_id("scheduler", "a.b", "c", partition=0)
            != transactional_id("scheduler", "a", "b.c", partition=0))
    assert not transactional_id("scheduler", "a.b", "c", partition=0).startswith(
        transactional_prefix("scheduler", "a", "b"))
    assert not transactional_id("scheduler", "a.b", "c", partition=0).startswith(
        transactional_prefix("scheduler", "a", "b.c"))
    # A ticker of catalog "c" and a scheduler whose group is "schedules" never meet either.
    assert not transactional_id("scheduler", "schedules", "c", partition=0).startswith(
        transactional_prefix("ticker", "c"))


def test_the_format_is_readable() -> None:
    assert transactional_id("scheduler", "streamsched.x", "orders", partition=3) == \
        "streamsched:scheduler:streamsched.x:orders:3"
    assert transactional_prefix("ticker", "nightly") == "streamsched:ticker:nightly:"
    # A process's one producer: under the same prefix (the role's ACL covers it).
    assert member_transactional_id("ticker", "nightly", member="ticker-0") == \
        "streamsched:ticker:nightly:w-ticker-0"


@given(owners, owners, partitions, partitions)
def test_distinct_owners_or_partitions_never_share_an_id(a: tuple[str, ...], b: tuple[str, ...],
                                                         pa: int, pb: int) -> None:
    if (a, pa) != (b, pb):
        assert _id(a, pa) != _id(b, pb)
    else:
        assert _id(a, pa) == _id(b, pb)


@given(owners, owners, partitions)
def test_a_prefix_matches_exactly_its_own_owners_ids(a: tuple[str, ...], b: tuple[str, ...], p: int) -> None:
    prefix = transactional_prefix(a[0], *a[1:])
    assert _id(a, p).startswith(prefix)
    assert _id(b, p).startswith(prefix) == (a == b)
    # Neither is one prefix a prefix of another owner's prefix (a PREFIXED ACL on it would cover it).
    assert transactional_prefix(b[0], *b[1:]).startswith(prefix) == (a == b)


@given(owners, partitions)
def test_an_id_splits_back_into_its_parts(a: tuple[str, ...], p: int) -> None:
    assert _id(a, p).split(TXN_SEPARATOR) == ["streamsched", *a, str(p)]


@pytest.mark.parametrize(("role", "parts", "partition"), [
    ("scheduler", ("a:b", "c"), 0),  # the separator itself: would make ids ambiguous again
    ("scheduler", ("a", ""), 0),
    ("scheduler", ("a b", "c"), 0),
    ("scheduler", ("a",), 0),  # too few parts: its prefix would cover every topic of group a
    ("ticker", ("c", "d"), 0),
    ("worker", ("a", "b"), 0),
    ("scheduler", ("a", "b"), -1),
    ("scheduler", ("a", "b"), True),
])
def test_what_would_make_ids_ambiguous_is_refused(role: str, parts: tuple[str, ...], partition: int) -> None:
    with pytest.raises(InvalidName):
        transactional_id(role, *parts, partition=partition)


def test_a_default_group_longer_than_a_name_is_accepted() -> None:
    # SchedulerDef's default group is "streamsched." + a name of up to MAX_NAME_LENGTH characters.
    group = "streamsched." + "n" * 200
    tid = transactional_id("scheduler", group, "t", partition=0)
    assert tid == f"streamsched:scheduler:{group}:t:0"
