"""Restore progress of a partition read to its end (claim stores and schedule tickers alike).

A restore reads a whole state partition before the partition serves turns, so it is the one
long wait an operator sees: it is reported as it goes, as metrics (``restore_records``,
``restore_remaining``, ``restore_seconds``, ``restores`` by kind) and a log line every few seconds,
offsets and counts only (never keys or values).
"""

from __future__ import annotations

import logging
import time

from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0
"""Least time between two progress log lines of one restore."""


class Progress:
    """Restore progress of one partition: ``restore_records``/``restore_remaining`` metrics and
    a log line every few seconds (offsets and counts only)."""

    def __init__(self, metrics: Metrics | None, topic: str, partition: int, start: int, end: int,
                 kind: str) -> None:
        self.metrics, self.topic, self.partition = metrics, topic, partition
        self.start, self.end, self.kind = start, end, kind
        self.records = 0
        self.t0 = self._last_log = time.monotonic()
        if metrics is not None:
            metrics.inc("restores", kind=kind)
            metrics.set_gauge("restore_remaining", max(0, end - start), partition=str(partition))

    def page(self, records: int, position: int) -> None:
        self.records += records
        if self.metrics is not None:
            self.metrics.inc("restore_records", records, partition=str(self.partition))
            self.metrics.set_gauge("restore_remaining", max(0, self.end - position),
                                   partition=str(self.partition))
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            done = (position - self.start) / max(1, self.end - self.start)
            log.info("restoring %s[%d] (%s): offset %d of %d (%.0f%%), %d records in %.1fs", self.topic,
                     self.partition, self.kind, position, self.end, 100 * done, self.records, now - self.t0)

    def done(self) -> float:
        elapsed = time.monotonic() - self.t0
        if self.metrics is not None:
            self.metrics.observe("restore_seconds", elapsed, partition=str(self.partition))
            self.metrics.set_gauge("restore_remaining", 0, partition=str(self.partition))
        log.info("restored %s[%d] (%s) from offset %d to %d: %d records in %.2fs", self.topic,
                 self.partition, self.kind, self.start, self.end, self.records, elapsed)
        return elapsed
