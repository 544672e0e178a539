"""Redaction of status documents: rebuild them from known-safe parts, drop everything else.

:class:`~streamsched.metrics.Metrics` only accepts names and label values from a closed
vocabulary and keeps the latest error as ``{type, kind, at_ns}``, but the status endpoint, its
client and the table enforce that again on every document they serve, read or print: a payload,
credential or plaintext identity that reached a ``Metrics`` by mistake (or a document from a
server that is not ours) is never shown. Separate from the server so the client and the table
use the very same rules, with no HTTP code attached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from streamsched.metrics import MAX_SERIES, QUANTILES, SCHEDULER, parse_series_key

__all__ = ["REDACTED", "SNAPSHOT_KEYS", "STATUS_KEYS", "redact_snapshot", "redact_status"]

REDACTED: Final = "<redacted>"
"""Stands for a scheduler name that did not fit the grammar."""
SNAPSHOT_KEYS: Final = frozenset(
    {"scheduler", "counters", "gauges", "histograms", "quantiles", "last_error", "started_ns"})
STATUS_KEYS: Final = frozenset({"schedulers", "pid", "uptime_s", "ready"})
MAX_SCHEDULERS: Final = 128

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
# ASCII only (no re.UNICODE classes), bounded length: a value that does not fit is dropped, never
# truncated or escaped.
_ERROR_TYPE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}", re.ASCII)
_ERROR_KIND: Final = re.compile(r"[a-z_]{1,64}", re.ASCII)
_QUANTILE_KEYS: Final = frozenset(str(q) for q in QUANTILES)


def _safe_number(value: object) -> int | float | None:
    # Exact types only: an int/float subclass (IntEnum, a custom class) may render as anything.
    if type(value) is int:
        return value if _INT_MIN <= value <= _INT_MAX else None
    if type(value) is float:
        return value
    return None


def _safe_int(value: object) -> int | None:
    number = _safe_number(value)
    return number if type(number) is int else None


def _safe_name(value: object, grammar: re.Pattern[str]) -> str | None:
    if type(value) is str and grammar.fullmatch(value):
        return value
    return None


def _safe_key(key: object, *, latency: bool = False) -> str | None:
    """``key`` if it is a series key in the metrics vocabulary (a ``*_seconds`` one if ``latency``)."""
    parsed = parse_series_key(key)
    if parsed is None or (latency and not parsed[0].endswith("_seconds")):
        return None
    return key if type(key) is str else None


def _safe_numbers(value: object, *, ints_only: bool) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    if not isinstance(value, Mapping):
        return out
    for key, raw in value.items():
        if len(out) >= MAX_SERIES:
            break
        name = _safe_key(key)
        number = _safe_int(raw) if ints_only else _safe_number(raw)
        if name is not None and number is not None:
            out[name] = number
    return out


def _safe_histograms(value: object) -> dict[str, dict[str, int | float]]:
    out: dict[str, dict[str, int | float]] = {}
    if not isinstance(value, Mapping):
        return out
    for key, raw in value.items():
        if len(out) >= MAX_SERIES:
            break
        name = _safe_key(key, latency=True)
        if name is None or not isinstance(raw, Mapping):
            continue
        count, total = _safe_int(raw.get("count")), _safe_number(raw.get("sum"))
        if count is not None and count >= 0 and total is not None:
            out[name] = {"count": count, "sum": float(total)}
    return out


def _safe_quantiles(value: object) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if not isinstance(value, Mapping):
        return out
    for key, raw in value.items():
        if len(out) >= MAX_SERIES:
            break
        name = _safe_key(key, latency=True)
        if name is None or not isinstance(raw, Mapping):
            continue
        qs: dict[str, float] = {}
        for q, v in raw.items():
            number = _safe_number(v)
            if type(q) is str and q in _QUANTILE_KEYS and number is not None:
                qs[q] = float(number)
        if qs:
            out[name] = qs
    return out


def _safe_error(value: object) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    err: dict[str, Any] = {}
    if (etype := _safe_name(value.get("type"), _ERROR_TYPE)) is not None:
        err["type"] = etype
    if (kind := _safe_name(value.get("kind"), _ERROR_KIND)) is not None:
        err["kind"] = kind
    if (at_ns := _safe_int(value.get("at_ns"))) is not None:
        err["at_ns"] = at_ns
    return err or None


def redact_snapshot(snapshot: object) -> dict[str, Any]:
    """Rebuild a :meth:`Metrics.snapshot <streamsched.metrics.Metrics.snapshot>` from safe parts.

    The result has exactly the keys :data:`SNAPSHOT_KEYS`: ``scheduler`` (a legal scheduler name,
    else ``"<redacted>"``), ``counters`` (series key -> int), ``gauges`` (series key -> int or
    float), ``histograms`` (``*_seconds`` series key -> ``{"count": int, "sum": float}``),
    ``quantiles`` (``*_seconds`` series key -> ``{"0.5"|"0.99": float}``), ``last_error``
    (``None`` or a subset of ``{"type": identifier, "kind": [a-z_]+, "at_ns": int}``) and
    ``started_ns`` (int or ``None``). Series keys must parse with
    :func:`~streamsched.metrics.parse_series_key` (closed names, label names and value grammars);
    ints are bounded to 64 bits; at most ``MAX_SERIES`` entries per map. Anything else, at any
    depth, is dropped. Total: never raises for any input.
    """
    snap: Mapping[Any, Any] = snapshot if isinstance(snapshot, Mapping) else {}
    return {
        "scheduler": _safe_name(snap.get("scheduler"), SCHEDULER) or REDACTED,
        "counters": _safe_numbers(snap.get("counters"), ints_only=True),
        "gauges": _safe_numbers(snap.get("gauges"), ints_only=False),
        "histograms": _safe_histograms(snap.get("histograms")),
        "quantiles": _safe_quantiles(snap.get("quantiles")),
        "last_error": _safe_error(snap.get("last_error")),
        "started_ns": _safe_int(snap.get("started_ns")),
    }


def redact_status(doc: object) -> dict[str, Any]:
    """Rebuild a whole ``/status`` document from safe parts (see :func:`redact_snapshot`).

    Keys :data:`STATUS_KEYS`: ``schedulers`` (redacted snapshots), ``pid`` (int >= 0 or
    ``None``), ``uptime_s`` (float or ``None``), ``ready`` (bool or ``None``).
    """
    d: Mapping[Any, Any] = doc if isinstance(doc, Mapping) else {}
    schedulers = d.get("schedulers")
    items = list(schedulers[:MAX_SCHEDULERS]) if isinstance(schedulers, list) else []
    pid = _safe_int(d.get("pid"))
    uptime = _safe_number(d.get("uptime_s"))
    ready = d.get("ready")
    return {
        "schedulers": [redact_snapshot(s) for s in items],
        "pid": pid if pid is not None and pid >= 0 else None,
        "uptime_s": float(uptime) if uptime is not None else None,
        "ready": ready if type(ready) is bool else None,
    }
