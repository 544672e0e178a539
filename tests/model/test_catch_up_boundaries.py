"""Defect 4c: exactly what a catch-up fires and what it counts as skipped, at the 64 boundary.

Pure (no broker): ``plan_catch_up`` is the whole decision; the ticker fires ``plan.fire`` and adds
``plan.skipped`` to the schedule state (tests/schedules/test_schedules.py proves that part on a
real broker for 100 missed boundaries).
"""

from __future__ import annotations

import pytest

from streamsched.model import limits
from streamsched.model.specs import NS_PER_S, Every, Spec, parse_spec, plan_catch_up

MIN = 60 * NS_PER_S
HOUR = 60 * MIN
EDGES = [63, 64, 65, 100]


def _expected_catch_up(due: list[int]) -> tuple[tuple[int, ...], int]:
    """As docs/schedules.md states it: the first 64 due boundaries, then the latest."""
    if len(due) <= limits.MAX_CATCH_UP + 1:
        return tuple(due), 0
    return (*due[: limits.MAX_CATCH_UP], due[-1]), len(due) - limits.MAX_CATCH_UP - 1


def test_the_default_bound_is_64() -> None:
    assert limits.MAX_CATCH_UP == 64


@pytest.mark.parametrize("missed", EDGES)
def test_catch_up_fires_the_first_64_then_the_latest_every(missed: int) -> None:
    # Last planned at 0, down until 30 s after boundary number `missed`: boundaries 1..missed are due.
    plan = plan_catch_up(Every(MIN), 0, missed * MIN + 30 * NS_PER_S, policy="catch_up")
    if missed <= 65:
        assert plan.fire == tuple(k * MIN for k in range(1, missed + 1))
        assert plan.skipped == 0
    else:
        assert plan.fire == (*(k * MIN for k in range(1, 65)), missed * MIN)
        assert plan.skipped == missed - 65
    assert len(plan.fire) == min(missed, 65)
    assert len(plan.fire) + plan.skipped == missed
    assert plan.next_planned_ns == (missed + 1) * MIN


@pytest.mark.parametrize("missed", EDGES)
def test_coalesce_fires_only_the_latest_every(missed: int) -> None:
    plan = plan_catch_up(Every(MIN), 0, missed * MIN + 30 * NS_PER_S, policy="coalesce")
    assert plan.fire == (missed * MIN,)
    assert plan.skipped == missed - 1
    assert plan.next_planned_ns == (missed + 1) * MIN


@pytest.mark.parametrize(
    ("missed", "catch_up_fired", "catch_up_skipped", "coalesce_skipped"),
    [(63, 63, 0, 62), (64, 64, 0, 63), (65, 65, 0, 64), (100, 65, 35, 99)],
)
def test_the_documented_table(missed: int, catch_up_fired: int, catch_up_skipped: int,
                              coalesce_skipped: int) -> None:
    """The table in plan_catch_up's docstring, docs/schedules.md and ``schedule --help``, row by row."""
    caught = plan_catch_up(Every(MIN), 0, missed * MIN, policy="catch_up")
    coalesced = plan_catch_up(Every(MIN), 0, missed * MIN, policy="coalesce")
    assert (len(caught.fire), caught.skipped) == (catch_up_fired, catch_up_skipped)
    assert (len(coalesced.fire), coalesced.skipped) == (1, coalesce_skipped)


@pytest.mark.parametrize(
    ("spec", "step"),
    [(parse_spec("* * * * *"), MIN), (parse_spec("0 * * * *", timezone="Europe/Berlin"), HOUR)],
    ids=["cron-utc-minutely", "cron-berlin-hourly"],
)
@pytest.mark.parametrize("missed", EDGES)
def test_cron_catch_up_and_coalesce_at_the_edges(spec: Spec, step: int, missed: int) -> None:
    # Berlin: the window starts 2026-10-24 and crosses the fall-back, where one wall hour repeats
    # and fires once: the due boundaries are whatever the spec lists, the bound applies to them.
    last = 1_792_800_000 * NS_PER_S  # 2026-10-24T00:00:00Z, on both grids
    due = spec.boundaries(last, last + (missed + 1) * step, missed)
    assert len(due) == missed
    now = due[-1] + step // 2
    plan = plan_catch_up(spec, last, now, policy="catch_up")
    assert (plan.fire, plan.skipped) == _expected_catch_up(due)
    assert plan_catch_up(spec, last, now, policy="coalesce").fire == (due[-1],)
    assert plan_catch_up(spec, last, now, policy="coalesce").skipped == missed - 1
    assert plan.next_planned_ns == spec.next_after(now)
