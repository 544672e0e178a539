"""Allocation snapshots of a running worker, for telling a leak from a cache that fills up.

With ``STREAMSCHED_TRACEMALLOC_DIR`` set, ``streamsched run`` starts :mod:`tracemalloc` and writes a
snapshot to that directory on every SIGUSR2 (``<pid>-<n>.tracemalloc``); :func:`growth` compares
two of them by source line. RSS alone cannot say what grows: the claim stores' bounded caches
(RocksDB's block cache and memtables, decoded claims) are reported by ``store_memory_bytes``, and
what Python itself allocates is what these snapshots show. Tracing costs CPU and memory of its own
(one trace per live block), so it is a diagnostic, never on by default.

The standard library's snapshot format is used as is: a snapshot can also be read with
``tracemalloc.Snapshot.load`` by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streamsched import settings

log = logging.getLogger(__name__)

#: Frames kept per allocation: enough to see which of our lines holds a block that a library
#: allocated (aiokafka, the Prometheus client), few enough to keep the tracing cheap.
FRAMES = 12


@dataclass(frozen=True)
class LineGrowth:
    """The growth of what one source line (the innermost frame of ours, if any) holds."""

    where: str
    size_diff: int
    count_diff: int

    def to_dict(self) -> dict[str, object]:
        return {"where": self.where, "kib": round(self.size_diff / 1024, 1), "blocks": self.count_diff}


@contextmanager
def snapshots_on_signal(directory: Path | None = None) -> Iterator[Path | None]:
    """While open, trace allocations and dump a snapshot into ``directory`` (default: the
    ``STREAMSCHED_TRACEMALLOC_DIR`` setting; nothing happens when neither is set) on each SIGUSR2.
    Needs a running event loop."""
    directory = directory or settings.value("STREAMSCHED_TRACEMALLOC_DIR")
    if directory is None:
        yield None
        return
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(FRAMES)
    loop = asyncio.get_running_loop()
    seq = itertools.count(1)

    def dump() -> None:
        path = directory / f"{os.getpid()}-{next(seq):03d}.tracemalloc"
        # Our own tracing structures are not what we look for.
        snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        snap.dump(str(path))
        log.info("tracemalloc snapshot written: %s (traced %d bytes)", path.name,
                 tracemalloc.get_traced_memory()[0])

    loop.add_signal_handler(signal.SIGUSR2, dump)
    try:
        yield directory
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)
        if started:
            tracemalloc.stop()


def _ours(frames: tracemalloc.Traceback) -> str:
    """The innermost frame in streamsched's own code, else the innermost frame: the line a
    reader can act on."""
    for frame in reversed(frames):  # tracemalloc orders frames oldest first
        if f"{os.sep}streamsched{os.sep}" in frame.filename:
            return f"{frame.filename.rsplit(os.sep + 'streamsched' + os.sep, 1)[1]}:{frame.lineno}"
    first = frames[-1]
    return f"{first.filename.rsplit(os.sep + 'site-packages' + os.sep, 1)[-1]}:{first.lineno}"


def growth(before: Path, after: Path, *, top: int = 15) -> list[LineGrowth]:
    """What grew between two snapshots, by the line of ours that allocated it (a library's block
    is charged to the streamsched line that called into it), largest growth first."""
    old = tracemalloc.Snapshot.load(str(before))
    new = tracemalloc.Snapshot.load(str(after))
    totals: dict[str, list[int]] = {}
    for stat in new.compare_to(old, "traceback"):
        row = totals.setdefault(_ours(stat.traceback), [0, 0])
        row[0] += stat.size_diff
        row[1] += stat.count_diff
    ranked = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)
    return [LineGrowth(where, size, count) for where, (size, count) in ranked[:top]]
