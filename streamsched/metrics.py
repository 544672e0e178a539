"""Prometheus metrics of one scheduler (or ticker), with a bounded vocabulary.

Why prometheus_client: it is the reference implementation of the data model the metrics are
scraped into (counters, gauges, histograms with ``_sum``/``_count`` so replicas aggregate), and its
per-child update costs well under a microsecond (measured: 0.5 us ``inc``, 1 us ``observe``),
below the noise of a turn. Every :class:`Metrics` owns its own ``CollectorRegistry``: several
workers may share one process (tests, ``streamsched run`` with several schedulers), and the
process-global default registry would merge or reject their series.

The vocabulary is closed, because a metric name or label value is served to anyone who can reach
the status port and must never carry data:

* names match ``[a-z][a-z0-9_]*`` (at most 63 characters) and do not end in a suffix Prometheus
  reserves (``_total``, ``_count``, ``_sum``, ``_bucket``, ``_created``, ``_info``);
* labels are only ``partition`` (digits or an int; the legacy ``p3`` is read as ``3``), ``kind``
  and ``reason`` (``[a-z][a-z0-9_]*``); every series also carries ``scheduler``;
* latencies are histograms named ``*_seconds``. ``observe("x_ms", v)`` is accepted as
  ``observe("x_seconds", v / 1000)`` (and :meth:`Metrics.percentile` of ``x_ms`` answers in
  milliseconds) so call sites written before the switch keep working; new code uses seconds;
* at most :data:`MAX_FAMILIES` names and :data:`MAX_SERIES` label sets per :class:`Metrics`.

Anything outside the vocabulary or past a bound is dropped and counted in
``streamsched_metrics_dropped_total{reason=...}``; it never raises into the caller's turn. The
latest error is kept as its type and kind only: messages may carry payload fragments.

Every name the package updates is declared once in :data:`METRICS` (type, labels, HELP text).
The declaration does not gate updates (an undeclared name is served with a generic HELP line);
tests hold the code, docs/metrics.md (:func:`reference_markdown`), the Grafana dashboard and the
alert rules in deploy/ to it.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from streamsched.errors import StreamschedError
from streamsched.metric_table import (
    METRICS,
    PREFIX,
    SAMPLE_SUFFIXES,
    Declared,
    MetricType,
    declared,
    help_text,
    reference_markdown,
)

__all__ = [
    "LABELS",
    "LATENCY_BUCKETS",
    "MAX_FAMILIES",
    "MAX_SERIES",
    "METRICS",
    "NAME",
    "PREFIX",
    "QUANTILES",
    "SAMPLE_SUFFIXES",
    "SCHEDULER",
    "Declared",
    "MetricType",
    "Metrics",
    "declared",
    "help_text",
    "parse_series_key",
    "reference_markdown",
    "series_key",
]

_NUMBER: Final = (int, float)
"""What a metric value may be (a prebuilt tuple: ``int | float`` builds a union per call)."""
MAX_FAMILIES: Final = 128
"""Most distinct metric names one :class:`Metrics` holds."""
MAX_SERIES: Final = 2048
"""Most label sets (over all names) one :class:`Metrics` holds: enough for 1,000 partitions."""
MAX_SAMPLES: Final = 4096
"""Recent observations kept per latency series for :meth:`Metrics.percentile`."""
MAX_RINGS: Final = 32
"""Most latency series with a window of recent observations (the histogram is always kept)."""
QUANTILES: Final = (0.5, 0.99)
"""Quantiles of each latency series in :meth:`Metrics.snapshot`."""
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                          2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
"""Histogram buckets in seconds: a turn takes milliseconds, a commit behind a slow broker seconds."""

NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,62}", re.ASCII)
"""Grammar of a metric name (before :data:`PREFIX`)."""
SCHEDULER: Final = re.compile(r"[A-Za-z0-9._-]{1,200}", re.ASCII)
"""Grammar of a scheduler name (``streamsched.model.names``), the ``scheduler`` label."""
_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
LABELS: Final[Mapping[str, re.Pattern[str]]] = {
    "partition": re.compile(r"[0-9]{1,6}", re.ASCII),
    "kind": _KIND,
    "reason": _KIND,
}
"""The only label names a caller may use, with the grammar of their values."""
_RESERVED_SUFFIXES: Final = ("_total", "_count", "_sum", "_bucket", "_created", "_info")
_ERROR_TYPE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}", re.ASCII)
_LEGACY_PARTITION: Final = re.compile(r"p([0-9]{1,6})", re.ASCII)
_DROPPED: Final = "metrics_dropped"

def series_key(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """``name`` or ``name{k=v,...}`` (labels sorted): the key of a series in :meth:`Metrics.snapshot`."""
    pairs = sorted(labels)
    return f"{name}{{{','.join(f'{k}={v}' for k, v in pairs)}}}" if pairs else name


def parse_series_key(key: object) -> tuple[str, dict[str, str]] | None:
    """Inverse of :func:`series_key`, or ``None`` unless ``key`` is entirely in the vocabulary."""
    if type(key) is not str:
        return None
    name, brace, rest = key.partition("{")
    if not NAME.fullmatch(name) or name.endswith(_RESERVED_SUFFIXES):
        return None
    labels: dict[str, str] = {}
    if brace:
        if not rest.endswith("}"):
            return None
        for pair in rest[:-1].split(","):
            k, eq, v = pair.partition("=")
            grammar = LABELS.get(k)
            if not eq or grammar is None or k in labels or not grammar.fullmatch(v):
                return None
            labels[k] = v
        if series_key(name, labels.items()) != key:
            return None  # unsorted labels: one series, one spelling
    return name, labels


class Metrics:
    """Counters, gauges and latency histograms of one scheduler, in ``registry``.

    ``scheduler`` labels every series (a name outside the scheduler grammar is served as
    ``invalid``: the label is public). The update methods never raise for a bad name, label or
    value: they drop the update and count it (see the module docstring).
    """

    __slots__ = ("_canon", "_counters", "_dropped", "_families", "_gauges", "_histograms", "_rings",
                 "last_error", "registry", "scheduler", "started_ns")

    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler if SCHEDULER.fullmatch(scheduler) else "invalid"
        self.registry = CollectorRegistry(auto_describe=False)
        self.last_error: dict[str, Any] | None = None
        self.started_ns = time.time_ns()
        # name -> (type, label names, family); the family's first use fixes its type and labels.
        self._families: dict[str, tuple[str, tuple[str, ...], MetricWrapperBase]] = {}
        # Canonical series (type, name, labels) -> child, and the caller's spellings -> child.
        self._canon: dict[tuple[str, str, tuple[tuple[str, str], ...]], Any] = {}
        self._counters: dict[Any, Any] = {}
        self._gauges: dict[Any, Any] = {}
        self._histograms: dict[Any, tuple[Any, float, deque[float] | None]] = {}
        self._rings: dict[str, deque[float]] = {}
        self._dropped = Counter(PREFIX + _DROPPED, help_text(_DROPPED, "counter"),
                                ["scheduler", "reason"], registry=self.registry)

    # --------------------------------------------------------------------------------- updates

    def inc(self, name: str, n: int = 1, **labels: str) -> None:
        """Add ``n`` (>= 0) to counter ``name`` (exported as ``streamsched_<name>_total``)."""
        # type() first: a plain int is what every caller passes (the union isinstance is built
        # per call, and this runs several times per item on the worker's hot path).
        if not (type(n) is int and n >= 0) and (not isinstance(n, _NUMBER) or not 0 <= n < math.inf):
            self._drop("value")
            return
        key = (name, *sorted(labels.items())) if labels else name
        child = self._counters.get(key)
        if child is None:
            child = self._child("counter", key, name, labels)
            if child is None:
                return
        child.inc(n)

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        """Set gauge ``name`` (exported as ``streamsched_<name>``) to ``value``."""
        if not isinstance(value, _NUMBER):
            self._drop("value")
            return
        key = (name, *sorted(labels.items())) if labels else name
        child = self._gauges.get(key)
        if child is None:
            child = self._child("gauge", key, name, labels)
            if child is None:
                return
        child.set(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record one latency of ``name`` (``*_seconds``; ``*_ms`` names take milliseconds)."""
        if not isinstance(seconds, _NUMBER) or not math.isfinite(seconds):
            self._drop("value")
            return
        key = (name, *sorted(labels.items())) if labels else name
        entry = self._histograms.get(key)
        if entry is None:
            entry = self._histogram(key, name, labels)
            if entry is None:
                return
        child, divisor, ring = entry
        value = seconds / divisor
        child.observe(value)
        if ring is not None:
            ring.append(value)

    def error(self, exc: BaseException) -> None:
        """Remember ``exc`` as the latest error (type and kind only) and count it by kind."""
        kind = exc.kind if isinstance(exc, StreamschedError) else "internal"
        kind = kind if type(kind) is str and _KIND.fullmatch(kind) else "invalid"
        etype = type(exc).__name__
        etype = etype if _ERROR_TYPE.fullmatch(etype) else "Exception"
        self.last_error = {"type": etype, "kind": kind, "at_ns": time.time_ns()}
        self.inc("errors", kind=kind)

    # ---------------------------------------------------------------------------------- reading

    def percentile(self, name: str, q: float) -> float | None:
        """Quantile ``q`` of the latest observations of series ``name`` (unlabelled), or ``None``.

        For a local view (bench, ``/status``); scrapers aggregate the histogram instead. A
        ``*_ms`` name answers in milliseconds.
        """
        canonical, scale = _canonical_latency(name)
        ring = self._rings.get(canonical)
        if not ring:
            return None
        ordered = sorted(ring)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale

    @property
    def counters(self) -> dict[str, int]:
        """Counter values by series key (``claims``, ``terminal{kind=decode}``, ...)."""
        return self.snapshot()["counters"]  # type: ignore[no-any-return]

    @property
    def gauges(self) -> dict[str, float]:
        """Gauge values by series key (``partitions``, ``committed_offset{partition=3}``, ...)."""
        return self.snapshot()["gauges"]  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view: counters, gauges, histograms (count/sum), quantiles, latest error.

        Keys are series keys (:func:`series_key`) without the ``scheduler`` label; latencies are
        in seconds; quantiles are over the latest :data:`MAX_SAMPLES` observations.
        """
        counters: dict[str, int] = {}
        gauges: dict[str, float] = {}
        histograms: dict[str, dict[str, float]] = {}
        # Only the families this object made: whatever else sits in the registry is not ours to
        # vouch for (the exposition filters it).
        for fam in (m for family in (self._dropped, *(f[2] for f in self._families.values()))
                    for m in family.collect()):
            name = fam.name.removeprefix(PREFIX)
            for s in fam.samples:
                labels = tuple((k, v) for k, v in s.labels.items() if k != "scheduler")
                if fam.type == "counter" and s.name == fam.name + "_total":
                    counters[series_key(name, labels)] = int(s.value)
                elif fam.type == "gauge" and s.name == fam.name:
                    gauges[series_key(name, labels)] = s.value
                elif fam.type == "histogram" and s.name in (fam.name + "_sum", fam.name + "_count"):
                    field = s.name.rpartition("_")[2]
                    h = histograms.setdefault(series_key(name, labels), {})
                    h[field] = int(s.value) if field == "count" else s.value
        quantiles = {key: {str(q): v for q in QUANTILES if (v := self.percentile(key, q)) is not None}
                     for key in self._rings}
        return {"scheduler": self.scheduler, "counters": counters, "gauges": gauges,
                "histograms": histograms, "quantiles": {k: v for k, v in quantiles.items() if v},
                "last_error": self.last_error, "started_ns": self.started_ns}

    # -------------------------------------------------------------------------------- internals

    def _drop(self, reason: str) -> None:
        self._dropped.labels(self.scheduler, reason).inc()

    def _child(self, mtype: str, key: Any, name: str, labels: Mapping[str, str]) -> Any:
        """Validate and create (or find) the series of a first-seen spelling ``key``."""
        cache = self._counters if mtype == "counter" else self._gauges
        if len(cache) >= 2 * MAX_SERIES:  # spellings per series are bounded (p3 vs 3): so is this
            self._drop("series")
            return None
        if not NAME.fullmatch(name) or name.endswith((*_RESERVED_SUFFIXES, "_ms")):
            self._drop("vocabulary")
            return None
        child = self._series(mtype, name, labels)
        if child is not None:
            cache[key] = child
        return child

    def _histogram(self, key: Any, name: str,
                   labels: Mapping[str, str]) -> tuple[Any, float, deque[float] | None] | None:
        if len(self._histograms) >= 2 * MAX_SERIES:
            self._drop("series")
            return None
        canonical, scale = _canonical_latency(name)
        if not NAME.fullmatch(canonical) or not canonical.endswith("_seconds"):
            self._drop("vocabulary")
            return None
        child = self._series("histogram", canonical, labels)
        if child is None:
            return None
        ring = None
        if not labels and (ring := self._rings.get(canonical)) is None and len(self._rings) < MAX_RINGS:
            ring = self._rings[canonical] = deque(maxlen=MAX_SAMPLES)
        entry = self._histograms[key] = (child, scale, ring)
        return entry

    def _series(self, mtype: str, name: str, labels: Mapping[str, object]) -> Any:
        values: dict[str, str] = {}
        for k, raw in labels.items():
            grammar = LABELS.get(k)
            v = str(raw) if type(raw) is int else raw  # partition=3 as well as partition="3"
            if grammar is None or not isinstance(v, str):
                self._drop("vocabulary")
                return None
            if k == "partition" and (m := _LEGACY_PARTITION.fullmatch(v)):
                v = m.group(1)
            if not grammar.fullmatch(v):
                self._drop("vocabulary")
                return None
            values[k] = v
        names = tuple(sorted(values))
        canon = (mtype, name, tuple((k, values[k]) for k in names))
        child = self._canon.get(canon)
        if child is not None:
            return child
        family = self._families.get(name)
        if family is None:
            if len(self._families) >= MAX_FAMILIES:
                self._drop("families")
                return None
            family = (mtype, names, _make_family(mtype, name, names, self.registry))
            self._families[name] = family
        if family[0] != mtype:
            self._drop("type_conflict")
            return None
        if family[1] != names:
            self._drop("labels")
            return None
        if len(self._canon) >= MAX_SERIES:
            self._drop("series")
            return None
        child = self._canon[canon] = family[2].labels(self.scheduler, *(values[k] for k in names))
        return child


def _canonical_latency(name: str) -> tuple[str, float]:
    """(``*_seconds`` name, how many of the caller's units make one second)."""
    if name.endswith("_ms"):
        return name[:-3] + "_seconds", 1000.0
    return name, 1.0


def _make_family(mtype: str, name: str, labelnames: tuple[str, ...],
                 registry: CollectorRegistry) -> MetricWrapperBase:
    full, labels, doc = PREFIX + name, ["scheduler", *labelnames], help_text(name, mtype)
    if mtype == "counter":
        return Counter(full, doc, labels, registry=registry)
    if mtype == "gauge":
        return Gauge(full, doc, labels, registry=registry)
    return Histogram(full, doc, labels, registry=registry, buckets=LATENCY_BUCKETS)
