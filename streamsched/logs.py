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
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Final

import orjson

from streamsched import settings

__all__ = ["CONTEXT_FIELDS", "JsonFormatter", "TextFormatter", "configure", "current_context", "log_context",
           "parse_level"]

CONTEXT_FIELDS: Final = ("scheduler", "partition", "offset", "identity", "fence", "trace_id")
"""The only fields a line's context may carry (all safe: names, numbers, digests, trace ids)."""

_context: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("streamsched_log_context",
                                                                                default={})  # noqa: B039


def current_context() -> dict[str, object]:
    """The context of the running task (a copy)."""
    return dict(_context.get())


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Add ``fields`` (of :data:`CONTEXT_FIELDS`; None values are left out) to every line logged
    in this block, by this task and the tasks it starts."""
    unknown = set(fields) - set(CONTEXT_FIELDS)
    if unknown:
        raise ValueError(f"not a log context field: {', '.join(sorted(unknown))}")
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


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
