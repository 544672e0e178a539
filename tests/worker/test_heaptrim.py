"""What closed claim stores freed goes back to the system: one trim per burst of closes."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from streamsched.testing import wait_for
from streamsched.worker import heaptrim
from tests.worker.test_claimstore import resolved, restored


def counted(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each trim that runs, recorded instead of trimming (the real call is tested on its own)."""
    ran: list[float] = []
    monkeypatch.setattr(heaptrim, "trim", lambda: ran.append(time.monotonic()) or True)  # on a thread
    return ran


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_glibc_can_trim_and_a_trim_is_counted() -> None:
    assert heaptrim.available()
    before = heaptrim.trims
    assert isinstance(heaptrim.trim(), bool)
    assert heaptrim.trims == before + 1


async def test_a_burst_of_closes_asks_for_one_trim_after_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = counted(monkeypatch)
    for _ in range(5):
        heaptrim.trim_soon(0.05)
    last = time.monotonic()

    def trimmed(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return len(ran) >= n

        return check

    await wait_for(trimmed(1), timeout=10, interval=0.01, what="the trim")
    assert len(ran) == 1 and ran[0] >= last + 0.05 - 0.01  # one, after the burst's last close
    heaptrim.trim_soon(0.05)  # a later close asks again
    await wait_for(trimmed(2), timeout=10, interval=0.01, what="a second trim")


async def test_closing_a_claim_store_asks_for_a_trim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.worker.rocksenv import StoreEnv

    asked: list[float] = []
    monkeypatch.setattr(heaptrim, "trim_soon", lambda delay_s=heaptrim.DELAY_S: asked.append(delay_s))
    env = StoreEnv(tmp_path / "stores", cache_bytes=64 * 1024)
    try:
        store = await restored(env, [])
        store.put(resolved("sched_a", 1, 1))
        assert asked == []
        store.close()
        assert asked == [heaptrim.DELAY_S]
    finally:
        env.close()
