"""`dr status` when the primary answers only in part (pure, with a stand-in consumer): a
partition that cannot be read, one whose scan never reaches its end, and a secondary record the
primary has nothing as new as, are reported as unknown or a lower bound, never as caught up."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from streamsched.ops import dr
from streamsched.ops.dr import PartitionLag, _compare, mirror_status


class StuckPrimary:
    """A primary consumer whose partition has records but no leader: fetches return nothing."""

    def __init__(self, *, end: int = 10, found: Any = "at-0", fail: bool = False) -> None:
        self.end, self.found, self.fail, self.pos = end, found, fail, 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def assign(self, tps: list[Any]) -> None: ...

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        if self.fail:
            raise KafkaTimeoutError()
        return {tps[0]: self.end}

    async def offsets_for_times(self, query: dict[Any, int]) -> dict[Any, Any]:
        tp = next(iter(query))
        return {tp: None if self.found is None else type("Found", (), {"offset": 0})()}

    async def seek_to_beginning(self, tp: Any) -> None: ...

    def seek(self, tp: Any, offset: int) -> None:
        self.pos = offset

    async def position(self, tp: Any) -> int:
        return self.pos

    async def getmany(self, tp: Any, **_: Any) -> dict[Any, list[Any]]:
        return {}


async def test_a_scan_that_never_reaches_the_end_is_a_lower_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dr, "PARTITION_SCAN_S", 0.2)
    lag = PartitionLag("t", 0, 5, 1000)
    await _compare(StuckPrimary(), lag, (1000, b"k", b"v"), decode_outcomes=False, scan_limit=100,
                   now_ms=2000)
    assert lag.exact is False  # never "caught up"


async def test_a_record_the_primary_has_nothing_as_new_as_is_unknown() -> None:
    lag = PartitionLag("t", 0, 5, 1000)
    await _compare(StuckPrimary(found=None), lag, (1000, b"k", b"v"), decode_outcomes=False, scan_limit=100,
                   now_ms=2000)
    assert (lag.behind, lag.behind_s, lag.exact) == (None, None, False)


async def test_an_unreadable_partition_is_reported_and_the_rest_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def newest(conn: Any, topics: list[str]) -> dict[tuple[str, int], tuple[int, Any]]:
        return {("t", 0): (5, (1000, b"k", b"v")), ("t", 1): (0, None)}

    monkeypatch.setattr(dr, "_newest", newest)
    monkeypatch.setattr(dr.clients, "consumer", lambda *a, **k: StuckPrimary(fail=True))
    status = await mirror_status("a:1", "b:1", ["t"])
    assert status.source_reachable
    assert [(p.partition, p.behind, p.exact, p.error) for p in status.partitions] == [
        (0, None, False, "KafkaTimeoutError"), (1, None, False, "KafkaTimeoutError")]
    assert status.to_dict()["exact"] is False


def test_the_status_table_says_what_is_a_bound_and_what_is_unknown() -> None:
    from streamsched.ops.cli.dr import _status_table
    from streamsched.ops.dr import MirrorStatus

    status = MirrorStatus(True, [PartitionLag("t", 0, 10, 1, behind=3, behind_s=1.5, outcomes=2),
                                 PartitionLag("t", 1, 5, 1, behind=None, behind_s=None, exact=False,
                                              error="KafkaTimeoutError")])
    lines = _status_table(status).splitlines()
    assert lines[0] == "behind: at least 3 record(s), oldest 1.5s old; outcomes not mirrored: at least 2"
    assert lines[1] == "t[0]  mirrored_end=10  behind=3  oldest=1.5s  outcomes=2"
    assert lines[2] == ("t[1]  mirrored_end=5  behind=?  oldest=-  outcomes=0  unreadable on the primary "
                        "(KafkaTimeoutError)")
    gone = _status_table(MirrorStatus(False, [PartitionLag("t", 0, 10, 7)])).splitlines()
    assert gone[0].startswith("the primary cluster did not answer")
