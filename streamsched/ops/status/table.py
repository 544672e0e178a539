"""Human-readable table of a ``/status`` document (``streamsched status``).

Kept apart from the client so that anything can be printed safely: the document is redacted
first (:func:`~.redact.redact_status`), whatever server produced it.
"""

from __future__ import annotations

import datetime

from streamsched.ops.status.redact import redact_status

__all__ = ["format_status"]

_BREAKER = {0: "closed", 1: "half-open", 2: "OPEN"}
"""The ``breaker_state`` gauge's values."""


def _format_ns(ns: int) -> str:
    try:
        when = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ns} ns"
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _format_number(value: float) -> str:
    return str(value) if type(value) is int else f"{value:.6g}"


def _format_seconds(value: float) -> str:
    return f"{value * 1000:.3g}ms" if abs(value) < 1 else f"{value:.3g}s"


def format_status(doc: object) -> str:
    """Table of a ``/status`` document: one block per scheduler.

    Counters and gauges sorted by series key, then each latency as count, mean and quantiles,
    then the last error. Safe on any input (the document is redacted first); never raises.
    """
    d = redact_status(doc)
    pid = "?" if d["pid"] is None else str(d["pid"])
    uptime = "?" if d["uptime_s"] is None else f"{d['uptime_s']:.1f}s"
    ready = {True: "yes", False: "no", None: "?"}[d["ready"]]
    out = [f"pid {pid}  uptime {uptime}  ready {ready}  schedulers {len(d['schedulers'])}"]
    for snap in d["schedulers"]:
        started = f"  (started {_format_ns(snap['started_ns'])})" if snap["started_ns"] is not None else ""
        out += ["", f"scheduler {snap['scheduler']}{started}"]
        names = [*snap["counters"], *snap["gauges"]]
        width = max((len(n) for n in names), default=0)
        for title, values in (("counters", snap["counters"]), ("gauges", snap["gauges"])):
            if not values:
                out.append(f"  {title}: none")
                continue
            out.append(f"  {title}:")
            out += [f"    {n:<{width}}  {_format_number(v):>14}" for n, v in sorted(values.items())]
        breakers = [f"{key[len('breaker_state{kind='):-1]} {_BREAKER.get(v, '?')}"
                    for key, v in sorted(snap["gauges"].items()) if key.startswith("breaker_state{kind=")]
        if breakers:
            out.append(f"  circuit breakers: {', '.join(breakers)}")
        latencies = sorted({*snap["histograms"], *snap["quantiles"]})
        for name in latencies:
            parts = []
            if (h := snap["histograms"].get(name)) is not None:
                parts.append(f"n {h['count']}")
                if h["count"]:
                    parts.append(f"mean {_format_seconds(h['sum'] / h['count'])}")
            qs = snap["quantiles"].get(name, {})
            parts += [f"p{float(q) * 100:g} {_format_seconds(v)}"
                      for q, v in sorted(qs.items(), key=lambda kv: float(kv[0]))]
            out.append(f"  {name}: {'  '.join(parts)}")
        err = snap["last_error"]
        if err is None:
            out.append("  last error: none")
        else:
            at = f" at {_format_ns(err['at_ns'])}" if "at_ns" in err else ""
            out.append(f"  last error: {err.get('type', '?')} ({err.get('kind', '?')}){at}")
    return "\n".join(out) + "\n"
