"""Prometheus text exposition of the :class:`~streamsched.metrics.Metrics` of one process.

prometheus_client writes the text format (``generate_latest``); this module only decides what
it is given. Each ``Metrics`` has its own registry (several schedulers per process), so one page
needs their families merged: one ``# HELP``/``# TYPE`` per family, series told apart by their
``scheduler`` label. The merge also re-validates every family and sample against the metrics
vocabulary, so a collector registered on a ``Metrics`` registry by mistake (or a series with a
payload in a label) is never served:

* family names are ``streamsched_<name>`` with ``<name>`` in the vocabulary, and the type is
  counter, gauge or histogram; HELP text is rebuilt from fixed strings, never copied;
* samples are the family's own (``_total``; the bare name; ``_bucket``/``_sum``/``_count``);
  ``_created`` samples are dropped (they double the page and aggregate to nothing);
* labels are ``scheduler`` (scheduler grammar), ``partition``/``kind``/``reason`` (their
  grammars) and ``le`` on buckets (a float); a sample with any other label is dropped;
* a family whose type differs from an earlier one of the same name, and a series already
  served (two ``Metrics`` of one scheduler name), are skipped: a scraper rejects the whole page
  for either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from streamsched.metrics import LABELS, NAME, PREFIX, SCHEDULER, Metrics, help_text

__all__ = ["CONTENT_TYPE", "render_prometheus"]

CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
"""``text/plain; version=0.0.4; charset=utf-8``: what ``generate_latest`` writes."""

_SUFFIXES: Final = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_RESERVED: Final = ("_total", "_count", "_sum", "_bucket", "_created", "_info")


def _safe_labels(labels: dict[str, str], *, bucket: bool) -> bool:
    if not SCHEDULER.fullmatch(labels.get("scheduler", "")):
        return False
    for key, value in labels.items():
        if key == "scheduler":
            continue
        if key == "le" and bucket:
            try:
                float(value)
            except ValueError:
                return False
            continue
        grammar = LABELS.get(key)
        if grammar is None or type(value) is not str or not grammar.fullmatch(value):
            return False
    return not bucket or "le" in labels


class _Merged(Collector):
    """Collector over the registries of ``metrics``, merged and re-validated (module docstring)."""

    def __init__(self, metrics: Sequence[Metrics]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for m in list(self.metrics):
            for fam in m.registry.collect():
                name = fam.name.removeprefix(PREFIX)
                suffixes = _SUFFIXES.get(fam.type)
                if (suffixes is None or not fam.name.startswith(PREFIX) or not NAME.fullmatch(name)
                        or name.endswith(_RESERVED)):
                    continue
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, help_text(name, fam.type), fam.type)
                elif out.type != fam.type:
                    continue
                for s in fam.samples:
                    suffix = s.name[len(fam.name):] if s.name.startswith(fam.name) else None
                    if suffix not in suffixes or type(s.value) not in (int, float):
                        continue
                    if not _safe_labels(s.labels, bucket=suffix == "_bucket"):
                        continue
                    key = (s.name, tuple(sorted(s.labels.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    value = float(s.value)
                    if fam.type != "gauge" and not math.isfinite(value):
                        continue  # a counter or histogram is finite by construction: not ours
                    out.add_sample(s.name, dict(s.labels), value)
        return [fam for fam in families.values() if fam.samples]


def render_prometheus(metrics: Sequence[Metrics]) -> bytes:
    """The ``/metrics`` page (text format 0.0.4, :data:`CONTENT_TYPE`) of ``metrics``."""
    return generate_latest(_Merged(metrics))
