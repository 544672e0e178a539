"""Log configuration and the context every log line of a worker carries.

``STREAMSCHED_LOG`` sets the level (``debug``, ``info``, ``warning``, ``error``; any case) and
``STREAMSCHED_LOG_FORMAT`` the format: ``text`` (default: one human line) or ``json`` (one JSON
object per line, for log pipelines). A bad value of either is a :class:`ConfigError` naming the
variable and what it accepts, never a traceback.

Both formats carry the context of the work a line is about, set with :func:`log_context` by the
runtime (never by reading a payload): ``scheduler`` and ``partition`` for everything a
partition's owner does, and ``identity`` (the ``sched_`` digest, not the plaintext), ``offset``,
``fence`` and ``trace_id`` while an item executes. Context lives in a :class:`contextvars.ContextVar`,
so it follows the task that set it and the tasks it starts, and never leaks between partitions.

Lines that repeat per item (a failed attempt, a dead letter) go through a :class:`RateLimiter`:
at most a few per key and interval, the rest counted and said as one "N more suppressed" line.
A traceback that must show at the default level (an unexpected failure) is rendered by
:func:`safe_traceback`: frames and exception types, never an exception's message.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

import orjson

from streamsched import settings

__all__ = ["CONTEXT_FIELDS", "JsonFormatter", "RateLimiter", "TextFormatter", "configure", "current_context",
           "log_context", "parse_level", "safe_traceback"]

CONTEXT_FIELDS: Final = ("scheduler", "partition", "offset", "identity", "fence", "trace_id")
"""The only fields a line's context may carry (all safe: names, numbers, digests, trace ids)."""

_context: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("streamsched_log_context",
                                                                                default={})  # noqa: B039


def current_context() -> dict[str, object]:
    """The context of the running task (a copy)."""
    return dict(_context.get())


_FIELD_SET: Final = frozenset(CONTEXT_FIELDS)


class log_context:
    """Add ``fields`` (of :data:`CONTEXT_FIELDS`; None values are left out) to every line logged
    in this block, by this task and the tasks it starts. (A class, not a generator context
    manager: the turn enters one per item, and the generator's machinery cost 2 % of a
    Kafka-native worker's CPU.)"""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: object) -> None:
        if not _FIELD_SET.issuperset(fields):
            unknown = set(fields) - _FIELD_SET
            raise ValueError(f"not a log context field: {', '.join(sorted(unknown))}")
        self._fields = fields
        self._token: contextvars.Token[dict[str, object]] | None = None

    def __enter__(self) -> None:
        added = {k: v for k, v in self._fields.items() if v is not None}
        self._token = _context.set({**_context.get(), **added})

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _context.reset(self._token)
            self._token = None


def _fields(record: logging.LogRecord) -> dict[str, object]:
    out = dict(_context.get())
    for name in CONTEXT_FIELDS:  # also as ``extra=`` of one call
        value = record.__dict__.get(name)
        if value is not None:
            out[name] = value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the context fields,
    and ``exc_type`` (only the type: an exception's message may carry payload fragments; the
    traceback is added at DEBUG only)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc_type"] = record.exc_info[0].__name__
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                doc["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger message [k=v ...]``: the human format, with the context at the end."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # a traceback stays below the line
        return head + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + sep + tail


def parse_level(text: str | None) -> int:
    """A level name (any case) as a number; :class:`ConfigError` names ``STREAMSCHED_LOG``."""
    if text is None or not text.strip():
        return logging.WARNING
    name = settings.parse(settings.declared("STREAMSCHED_LOG"), text)
    return int(getattr(logging, name))


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Configure the root logger from the arguments, else ``STREAMSCHED_LOG`` and
    ``STREAMSCHED_LOG_FORMAT`` (see the module docs)."""
    number = parse_level(level if level is not None else os.environ.get("STREAMSCHED_LOG"))
    fmt_var = settings.declared("STREAMSCHED_LOG_FORMAT")
    chosen = str(settings.parse(fmt_var, fmt) if fmt else settings.value(fmt_var.name) or "text").lower()
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_streamsched", False)]
    if root.handlers and not ours:
        return  # someone configured logging already (an embedding app, a test runner): theirs
    root.setLevel(number)
    for old in ours:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    handler._streamsched = True  # type: ignore[attr-defined]
    root.addHandler(handler)


@dataclass(slots=True)
class _Window:
    start: float
    passed: int = 0
    suppressed: int = 0


class RateLimiter:
    """At most ``lines`` lines per key in each ``interval_s``; the rest are counted.

    A per-interval counter per key (a key is e.g. (scheduler, line, error kind), so a flood of
    one failure never hides the first line of another). The count of a key's suppressed lines is
    handed to the first line that key logs in a later interval (:meth:`admit` returns it), which
    says it as "N more suppressed" before itself; a key that never logs again keeps its count
    unsaid (the metrics count every failure anyway). Memory is bounded: at most ``max_keys`` keys,
    the oldest forgotten first. Pure: the clock is injected.
    """

    def __init__(self, *, lines: int = 10, interval_s: float = 60.0, max_keys: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if lines < 1 or interval_s <= 0 or max_keys < 1:
            raise ValueError("a rate limiter needs lines >= 1, interval_s > 0 and max_keys >= 1")
        self.lines = lines
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()  # logging may happen on any thread
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, key: Hashable) -> int | None:
        """None: suppress this line (counted). Else log it, after saying that the returned
        number (0: none) of this key's lines were suppressed since its last line."""
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                if len(self._windows) >= self.max_keys:
                    del self._windows[next(iter(self._windows))]  # the oldest key
                window = self._windows[key] = _Window(now)
            elif now - window.start >= self.interval_s:
                window.start, window.passed = now, 0
            if window.passed >= self.lines:
                window.suppressed += 1
                return None
            window.passed += 1
            said, window.suppressed = window.suppressed, 0
            return said

    def __len__(self) -> int:
        return len(self._windows)

    def log(self, logger: logging.Logger, level: int, key: tuple[str, ...], msg: str, *args: object,
            extra: dict[str, object] | None = None) -> bool:
        """``logger.log(level, msg, *args)`` unless ``key`` is over its rate (then counted), led
        by a "N more suppressed" line when some were. True if the line was logged. A level the
        logger does not log costs nothing and counts nothing."""
        if not logger.isEnabledFor(level):
            return False
        said = self.admit(key)
        if said is None:
            return False
        if said:
            logger.log(level, "%d more %s line(s) suppressed (at most %d per %.0f s)", said, "/".join(key),
                       self.lines, self.interval_s, extra=extra)
        logger.log(level, msg, *args, extra=extra)
        return True


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def safe_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, causes and contexts included, but with each
    exception's type alone in place of ``Type: message``: where it failed, never what it held
    (a message may quote payload or a plaintext identity)."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    link = ""
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append((cur, link))
        if cur.__cause__ is not None:
            cur, link = cur.__cause__, "The above exception was the direct cause of the following exception:"
        elif cur.__context__ is not None and not cur.__suppress_context__:
            cur, link = cur.__context__, "During handling of the above exception, another exception occurred:"
        else:
            cur = None
    parts: list[str] = []
    for one, link in reversed(chain):  # the innermost first, as Python prints them
        if one.__traceback__ is not None:
            parts.append("Traceback (most recent call last):")
            frames = traceback.format_list(traceback.extract_tb(one.__traceback__))
            parts.extend(frame.rstrip("\n") for frame in frames)
        parts.append(_type_name(one))
        if link:  # how it leads to the exception printed next
            parts += ["", link, ""]
    return "\n".join(parts)
