"""Bounded counters and the latest redacted error of a worker.

Counter names are a fixed vocabulary chosen by the framework (never derived from data), and
the latest error is kept as its type and kind only: messages may carry payload fragments.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from streamsched.errors import StreamschedError

MAX_KEYS = 128
MAX_SAMPLES = 4096


class Metrics:
    __slots__ = ("counters", "gauges", "last_error", "samples", "scheduler", "started_ns")

    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, float] = {}
        self.last_error: dict[str, Any] | None = None
        self.started_ns = time.time_ns()
        self.samples: dict[str, deque[float]] = {}

    def inc(self, name: str, n: int = 1, **labels: str) -> None:
        name = _key(name, labels)
        if name in self.counters or len(self.counters) < MAX_KEYS:
            self.counters[name] = self.counters.get(name, 0) + n

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        name = _key(name, labels)
        if name in self.gauges or len(self.gauges) < MAX_KEYS:
            self.gauges[name] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Keep the latest MAX_SAMPLES observations of ``name`` (for percentiles)."""
        name = _key(name, labels)
        ring = self.samples.get(name)
        if ring is None:
            if len(self.samples) >= MAX_KEYS:
                return
            ring = self.samples[name] = deque(maxlen=MAX_SAMPLES)
        ring.append(value)

    def percentile(self, name: str, q: float) -> float | None:
        ring = self.samples.get(name)
        if not ring:
            return None
        ordered = sorted(ring)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def error(self, exc: BaseException) -> None:
        kind = exc.kind if isinstance(exc, StreamschedError) else "internal"
        self.last_error = {"type": type(exc).__name__, "kind": kind, "at_ns": time.time_ns()}
        self.inc("errors", kind=kind)

    def snapshot(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "counters": dict(self.counters),
                "gauges": dict(self.gauges), "last_error": self.last_error,
                "started_ns": self.started_ns}


def _key(name: str, labels: dict[str, str]) -> str:
    # Interim flat encoding of labels (name_value...), kept until the Prometheus-backed store.
    return "_".join([name, *(labels[k] for k in sorted(labels))]) if labels else name
