"""Allocation snapshots on SIGUSR2, and growth by source line between two of them."""

from __future__ import annotations

import asyncio
import os
import signal
import tracemalloc
from pathlib import Path

import pytest

from streamsched.ops import memtrace
from streamsched.testing import wait_for

held: list[bytes] = []


def allocate(n: int) -> None:
    held.extend(bytes(1024) + str(i).encode() for i in range(n))  # the line growth must name


async def snapshot(directory: Path, count: int) -> None:
    os.kill(os.getpid(), signal.SIGUSR2)

    async def written() -> bool:
        return len(list(directory.glob("*.tracemalloc"))) >= count

    await wait_for(written, timeout=30, interval=0.02, what=f"snapshot {count}")


async def test_sigusr2_writes_snapshots_and_growth_names_the_allocating_line(tmp_path: Path) -> None:
    assert not tracemalloc.is_tracing()
    with memtrace.snapshots_on_signal(tmp_path) as directory:
        assert directory == tmp_path and tracemalloc.is_tracing()
        await snapshot(tmp_path, 1)
        allocate(2000)
        await snapshot(tmp_path, 2)
    assert not tracemalloc.is_tracing()  # stopped again: it was not tracing before
    first, second = sorted(tmp_path.glob("*.tracemalloc"))
    assert first.name.startswith(f"{os.getpid()}-")
    top = memtrace.growth(first, second, top=3)
    line = allocate.__code__.co_firstlineno + 1
    assert top[0].where.endswith(f"test_memtrace.py:{line}")
    assert top[0].size_diff > 2000 * 1024 and top[0].count_diff >= 2000
    held.clear()


async def test_nothing_is_traced_without_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMSCHED_TRACEMALLOC_DIR", raising=False)
    with memtrace.snapshots_on_signal() as directory:
        assert directory is None and not tracemalloc.is_tracing()
        assert asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR2) is False


def test_our_line_is_charged_for_a_librarys_allocation() -> None:
    lib = ("/venv/site-packages/aiokafka/conn.py", 10)
    ours = ("/src/streamsched/worker/turn.py", 42)
    outer = ("/usr/lib/python3.11/asyncio/events.py", 80)
    tb = tracemalloc.Traceback((lib, ours, outer))  # innermost first, as the C API hands them over
    assert memtrace._ours(tb) == "worker/turn.py:42"
    assert memtrace._ours(tracemalloc.Traceback((lib,))) == "aiokafka/conn.py:10"
