"""aiokafka's produce-retry warnings that are routine under transactions, summarised.

Kafka 3.6+ brokers verify every transactional produce with the coordinator (KIP-890 part 1) and
answer one that races the previous transaction's markers with NOT_ENOUGH_REPLICAS, their
translation of CONCURRENT_TRANSACTIONS for clients that predate it (aiokafka included; see
:data:`streamsched.kafka.txn.RETRY_BACKOFF_MS`). aiokafka retries and logs a WARNING for each
one: measured, 73-204 lines per 47,000 Kafka-native items at half load and hundreds per minute
at full load, which buries the warnings that matter. The same error also means a real fault
(fewer in-sync replicas than ``min.insync.replicas``), so the records are not dropped silently:
the first one passes as it is, and the rest become one summary line per :data:`WINDOW_S` with
their count; a fault that persists therefore still shows every minute.

Only that one error in that one aiokafka message is touched; every other record passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

SENDER_LOGGER = "aiokafka.producer.sender"
WINDOW_S = 60.0

log = logging.getLogger(__name__)


class RetrySummary(logging.Filter):
    """Turns aiokafka's NOT_ENOUGH_REPLICAS produce-retry warnings into a count per window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self._clock = clock
        self._window_s = window_s
        self._lock = threading.Lock()  # logging may be called from any thread
        self._window_start: float | None = None
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_routine_retry(record):
            return True
        now = self._clock()
        with self._lock:
            if self._window_start is None:
                self._window_start = now
                return True  # the first one as it is: the operator sees what the summaries count
            if now - self._window_start < self._window_s:
                self._held += 1
                return False
            held, self._held, self._window_start = self._held + 1, 0, now
        log.warning("aiokafka retried %d produce requests after NOT_ENOUGH_REPLICAS in the last %.0f s "
                    "(routine on Kafka 3.6+ right after a transaction commits; if it never stops, a "
                    "partition has fewer in-sync replicas than min.insync.replicas)", held, self._window_s)
        return False


def _is_routine_retry(record: logging.LogRecord) -> bool:
    if record.levelno != logging.WARNING or not str(record.msg).startswith("Got error produce response on"):
        return False
    args = record.args if isinstance(record.args, tuple) else ()
    error = args[-1] if args else None
    name = getattr(error, "__name__", type(error).__name__)
    return name == "NotEnoughReplicasError"


_installed: RetrySummary | None = None
_install_lock = threading.Lock()


def install() -> RetrySummary:
    """Put the summary filter on aiokafka's sender logger, once per process."""
    global _installed
    with _install_lock:
        if _installed is None:
            _installed = RetrySummary()
            logging.getLogger(SENDER_LOGGER).addFilter(_installed)
        return _installed
