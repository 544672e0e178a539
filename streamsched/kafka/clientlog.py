"""aiokafka log records that streamsched reports better itself: three filters, nothing else touched.

**Routine produce retries** (:class:`RetrySummary`). Kafka 3.6+ brokers verify every
transactional produce with the coordinator (KIP-890 part 1) and answer one that races the
previous transaction's markers with NOT_ENOUGH_REPLICAS, their translation of
CONCURRENT_TRANSACTIONS for clients that predate it (aiokafka included; see
:data:`streamsched.kafka.txn.RETRY_BACKOFF_MS`). aiokafka retries and logs a WARNING for each
one: measured, 73-204 lines per 47,000 Kafka-native items at half load and hundreds per minute
at full load, which buries the warnings that matter. The same error also means a real fault
(fewer in-sync replicas than ``min.insync.replicas``), so the records are not dropped silently:
the first one passes as it is, and the rest become one summary line per :data:`WINDOW_S` with
their count; a fault that persists therefore still shows every minute.

Only that one error in that one aiokafka message is touched.

**Bootstrap failures before the first connection** (:class:`BootstrapErrors`). aiokafka logs an
ERROR for every bootstrap address it cannot reach, then raises; a command that cannot reach
Kafka at all already reports that in one line of its own (exit 3; see the documented exit codes), so
the ERROR lines in front of it only repeat it with a traceback-like prefix. Until a client of
this process has connected once, those records are held (address and error type only, at most
:data:`MAX_HELD`), and the CLI's one line names them; when a client connects, they are logged
as one WARNING (a bootstrap list with a dead entry still deserves a word); after that every
record passes as it is. Only the CLI installs this filter, and not with ``STREAMSCHED_LOG=DEBUG``.

**A group's coordinator not found yet at start** (:class:`CoordinatorStartup`). A consumer group
member first asks which broker coordinates its group; a cluster that just started (or whose
``__consumer_offsets`` topic is being created or loaded) answers with a retriable error such as
COORDINATOR_NOT_AVAILABLE for a few seconds, and aiokafka logs each answer at ERROR before it
asks again, then a WARNING "Marking the coordinator dead" when the join that follows is told
the coordinator is still loading: the quickstart's healthy start showed such lines. For
:data:`STARTUP_GRACE_S` after the process builds its first group member (:func:`group_starting`), those two
records are INFO (a lookup failure only if its error is retriable); past that deadline they pass
as they are (ERROR, WARNING): a coordinator still missing then is a fault.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

SENDER_LOGGER = "aiokafka.producer.sender"
CLIENT_LOGGER = "aiokafka"
"""aiokafka's client module logs its bootstrap failures under this name."""
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"
WINDOW_S = 60.0
MAX_HELD = 16
STARTUP_GRACE_S = 60.0
"""How long after a process builds its first group member coordinator-lookup failures are routine."""

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


_BOOTSTRAP_MSG = 'Unable connect to "%s:%s": %s'


class BootstrapErrors(logging.Filter):
    """Holds aiokafka's per-address bootstrap errors until a client of this process connects."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._connected = False
        self._held: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self._connected or record.msg != _BOOTSTRAP_MSG:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        with self._lock:
            if self._connected:
                return True
            if len(args) >= 2 and len(self._held) < MAX_HELD:
                # The address and the kind of failure (refused, no such host, TLS...): no message
                # text, which may quote more than we vouch for.
                why = type(args[2]).__name__ if len(args) > 2 else "error"
                self._held.append(f"{args[0]}:{args[1]} {why}")
        return False

    def held(self) -> list[str]:
        """The failures held so far, deduplicated (``host:port ErrorType``)."""
        with self._lock:
            return list(dict.fromkeys(self._held))

    def connected(self) -> None:
        """A client connected: say which addresses failed before, then let every record pass."""
        with self._lock:
            if self._connected:
                return
            self._connected, held, self._held = True, self._held, []
        if held:
            log.warning("bootstrap address(es) unreachable before a client connected: %s",
                        ", ".join(dict.fromkeys(held)))


_LOOKUP_MSG = "Group Coordinator Request failed: %s"
_DEAD_MSG = "Marking the coordinator dead (node %s)for group %s."


class CoordinatorStartup(logging.Filter):
    """aiokafka's coordinator-lookup failures (retriable ones) and "coordinator dead" warnings
    as INFO while a group member starts."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = STARTUP_GRACE_S) -> None:
        super().__init__()
        self._clock = clock
        self._grace_s = grace_s
        self._until = float("-inf")

    def starting(self) -> None:
        """A group member was built: lookups are routine for ``grace_s`` from the FIRST one of
        the process (its start). Later ones open no new grace period: a process that builds
        group consumers all along (the console reading lag) would otherwise never show a
        missing coordinator."""
        if self._until == float("-inf"):
            self._until = self._clock() + self._grace_s  # one float: no lock needed

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in (_LOOKUP_MSG, _DEAD_MSG) or record.levelno <= logging.INFO:
            return True
        if self._clock() >= self._until:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _LOOKUP_MSG and (not args or getattr(args[0], "retriable", False) is not True):
            return True  # a refusal (authorization...) stays an ERROR at once
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        # The logger's level let the ERROR through; it decides again for the INFO it now is
        # (handlers do not check the logger's level, only their own).
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


_filters: dict[str, logging.Filter] = {}
"""The filter installed on each aiokafka logger, by logger name (one per process)."""
_install_lock = threading.Lock()

_F = TypeVar("_F", bound=logging.Filter)


def _install(logger: str, make: Callable[[], _F]) -> _F:
    with _install_lock:
        installed = _filters.get(logger)
        if installed is None:
            installed = _filters[logger] = make()
            logging.getLogger(logger).addFilter(installed)
        return installed  # type: ignore[return-value]  # the one ``make`` built for this logger


def install() -> RetrySummary:
    """Put the summary filter on aiokafka's sender logger, once per process."""
    return _install(SENDER_LOGGER, RetrySummary)


def group_starting() -> CoordinatorStartup:
    """A consumer group member is being built: put the start filter on aiokafka's group
    coordinator logger and open its grace period (both once per process)."""
    startup = _install(COORDINATOR_LOGGER, CoordinatorStartup)
    startup.starting()
    return startup


def install_bootstrap() -> BootstrapErrors:
    """Put the bootstrap filter on aiokafka's client logger, once per process. The CLI does
    (its own one-line error reports the held failures, see :func:`held`); a library user's
    logging is left alone."""
    return _install(CLIENT_LOGGER, BootstrapErrors)


def _bootstrap() -> BootstrapErrors | None:
    installed = _filters.get(CLIENT_LOGGER)
    return installed if isinstance(installed, BootstrapErrors) else None


def held() -> list[str]:
    """Bootstrap failures held (none if the filter is not installed or a client connected)."""
    bootstrap = _bootstrap()
    return bootstrap.held() if bootstrap is not None else []


def connected() -> None:
    """Called once a client started: held bootstrap errors become one warning."""
    bootstrap = _bootstrap()
    if bootstrap is not None:
        bootstrap.connected()
