"""The soak's memory judgement and its allocation snapshots (bench/soak.py).

A worker's memory is judged twice, on each worker process alive from the judged span's start to
the end of the run:

* **RSS levels off**: its RSS at the end is within :data:`END_TOLERANCE` of its RSS at the middle
  minute (minute 45 of the default 90);
* **nothing grows outside the bounded caches**: its RSS minus what the claim stores report
  (``store_memory_bytes``: RocksDB's block cache and memtables, decoded claims), sampled every
  minute from the *settled* minute on (minute 20 of 90, scaled for shorter runs), stays within
  :data:`OUTSIDE_TOLERANCE` of its value at that minute.

With ``--tracemalloc-at``, the workers trace Python's allocations (``STREAMSCHED_TRACEMALLOC_DIR``,
:mod:`streamsched.ops.memtrace`): the soak sends SIGUSR2 at the listed minutes and at the end,
and reports by source line what grew between consecutive snapshots. Tracing adds memory of its
own, so a traced run says *what* grows; the judged run is the one without it.
"""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path
from typing import Any

from streamsched.ops import memtrace

END_TOLERANCE = 0.05
OUTSIDE_TOLERANCE = 0.05
SETTLED_FRACTION = 20 / 90
"""The minute from which the memory outside the caches must hold, as a fraction of the run."""


def judged_minutes(minutes: int) -> tuple[int, int]:
    """(settled minute, middle minute) of a run of ``minutes``."""
    return max(1, round(minutes * SETTLED_FRACTION)), max(1, minutes // 2)


def outside_mb(stats: dict[str, Any] | None) -> float | None:
    """RSS minus the claim stores' bounded caches, MB; None without both figures."""
    if not stats or not stats.get("store_mb"):
        return None
    return float(stats["rss_mb"]) - sum(stats["store_mb"].values())


def judge(samples: list[dict[str, Any]], names: list[str], minutes: int) -> tuple[dict[str, Any], list[str]]:
    """Each worker's memory figures and the reasons the run fails on memory (empty: it passed)."""
    settled, middle = judged_minutes(minutes)
    by_minute = {s["minute"]: s for s in samples}

    def at(minute: int, name: str) -> dict[str, Any] | None:
        stats: dict[str, Any] | None = by_minute.get(minute, {}).get("workers", {}).get(name)
        return stats

    out: dict[str, Any] = {"settled_minute": settled, "middle_minute": middle,
                           "end_tolerance_pct": END_TOLERANCE * 100,
                           "outside_tolerance_pct": OUTSIDE_TOLERANCE * 100}
    reasons: list[str] = []
    for name in names:
        first, mid, end = at(settled, name), at(middle, name), at(minutes, name)
        span = [at(m, name) for m in range(settled, minutes + 1)]
        if not (first and mid and end) or any(s is None or s["pid"] != end["pid"] for s in span):
            out[name] = {"judged": False, "why": "no one process alive and answering from minute "
                                                 f"{settled} to the end"}
            continue
        end_vs_mid = end["rss_mb"] / mid["rss_mb"] - 1
        row: dict[str, Any] = {"judged": True, "pid": end["pid"], "rss_settled_mb": first["rss_mb"],
                               "rss_middle_mb": mid["rss_mb"], "rss_end_mb": end["rss_mb"],
                               "end_vs_middle_pct": round(end_vs_mid * 100, 1)}
        if abs(end_vs_mid) > END_TOLERANCE:
            reasons.append(f"{name} (pid {end['pid']}) RSS at the end ({end['rss_mb']} MB) is "
                           f"{end_vs_mid * 100:+.1f} % from minute {middle} ({mid['rss_mb']} MB)")
        base = outside_mb(first)
        series = [outside_mb(s) for s in span]
        if base is None or any(x is None for x in series):
            row["outside_judged"] = False
            reasons.append(f"{name}: store memory not reported every minute from minute {settled}")
        else:
            devs = [(x or 0.0) / base - 1 for x in series]
            worst = max(devs, key=abs)
            row.update(outside_settled_mb=round(base, 1), outside_end_mb=round(series[-1] or 0.0, 1),
                       outside_worst_pct=round(worst * 100, 1), outside_judged=True)
            if abs(worst) > OUTSIDE_TOLERANCE:
                m = settled + devs.index(worst)
                reasons.append(f"{name} (pid {end['pid']}): RSS outside the store caches moved "
                               f"{worst * 100:+.1f} % from minute {settled} ({base:.1f} MB) by minute {m}")
        out[name] = row
    return out, reasons


def table(samples: list[dict[str, Any]], names: list[str], every: int = 10) -> list[str]:
    """Markdown rows, one per ``every`` minutes: each worker's RSS and RSS outside the caches."""
    head = "| minute | " + " | ".join(f"{n} RSS / outside caches, MB" for n in names) + " | faults begun |"
    rows = [head, "|" + "---|" * (len(names) + 2)]
    faults: list[str] = []
    for s in samples:
        faults += s.get("faults", [])
        if s["minute"] % every and s is not samples[-1]:
            continue
        cells = []
        for n in names:
            st = s.get("workers", {}).get(n)
            out = outside_mb(st)
            cells.append("-" if not st else f"{st['rss_mb']} / {'-' if out is None else round(out, 1)}")
        rows.append(f"| {s['minute']} | " + " | ".join(cells) + f" | {', '.join(faults) or ''} |")
        faults = []
    return rows


class Snapshots:
    """SIGUSR2 to the traced workers at chosen minutes; growth by line between their snapshots."""

    def __init__(self, directory: Path, minutes: list[int]) -> None:
        self.directory, self.minutes = directory, sorted(set(minutes))
        self.taken: dict[int, list[tuple[int, int]]] = {}  # pid -> [(minute, snapshot seq)]

    def env(self) -> dict[str, str]:
        return {"STREAMSCHED_TRACEMALLOC_DIR": str(self.directory)}

    def due(self, minute: int) -> bool:
        return minute in self.minutes

    def take(self, minute: int, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                continue
            seen = self.taken.setdefault(pid, [])
            seen.append((minute, len(seen) + 1))

    def report(self, *, top: int = 12) -> dict[str, Any]:
        """Per worker pid and span between consecutive snapshots: the lines that grew most."""
        out: dict[str, Any] = {}
        for pid, taken in self.taken.items():
            files = [(m, self.directory / f"{pid}-{seq:03d}.tracemalloc") for m, seq in taken]
            files = [(m, p) for m, p in files if p.exists()]
            for (m0, p0), (m1, p1) in itertools.pairwise(files):
                out[f"{pid}:{m0}-{m1}"] = [g.to_dict() for g in memtrace.growth(p0, p1, top=top)]
        return out
