"""Redaction of status documents and the merged, re-validated /metrics exposition (pure, no network)."""

from __future__ import annotations

import math
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prom_text import parse_prometheus

from streamsched.errors import DecodeError
from streamsched.metrics import Metrics
from streamsched.model.jsonval import json_dumps
from streamsched.ops.status import format_status, redact_snapshot, redact_status, render_prometheus
from streamsched.ops.status.redact import SNAPSHOT_KEYS, STATUS_KEYS

SECRET = "Hunter2:SECRET/card-4111"


def test_redact_snapshot_keeps_safe_data() -> None:
    m = Metrics("charge_due")
    m.inc("claims")
    m.inc("terminal", kind="decode")
    m.set_gauge("committed_offset", 3, partition="1")
    m.observe("turn_seconds", 0.25)
    m.error(DecodeError("x"))
    snap = m.snapshot()
    assert redact_snapshot(snap) == snap  # everything a Metrics produces survives unchanged
    assert set(snap) == SNAPSHOT_KEYS


def test_redact_snapshot_drops_unsafe_data() -> None:
    class Sneaky(int):
        def __repr__(self) -> str:
            return SECRET

        __str__ = __repr__

    out = redact_snapshot({
        "scheduler": f"bad {SECRET}",
        "counters": {"ok": 1, "Bad": 2, "x-y": 3, "flag": True, "big": 2**70, "sneaky": Sneaky(1),
                     "float": 1.5, 5: 5, "x_total": 1, f"t{{kind={SECRET}}}": 1, "t{topic=a}": 1,
                     "t{kind=decode}": 4, "t{partition=1,kind=a}": 1},
        "gauges": {"g": 1.5, "s": SECRET, "n": None, "nested": {"a": 1}, "o{partition=7}": 2},
        "histograms": {"turn_seconds": {"count": 2, "sum": 0.5, "extra": SECRET},
                       "turn": {"count": 1, "sum": 1.0},
                       "end_txn_seconds": {"count": -1, "sum": 1.0}, "x_seconds": {"count": 1}},
        "quantiles": {"turn_seconds": {"0.5": 1.0, "0.9": 2.0, "0.99": "x"}, "other": {"0.5": 1.0}},
        "last_error": {"type": "Bad Type", "kind": "decode", "at_ns": 1, "message": SECRET},
        "started_ns": "now",
        "payload": SECRET,
    })
    assert out == {"scheduler": "<redacted>", "counters": {"ok": 1, "t{kind=decode}": 4},
                   "gauges": {"g": 1.5, "o{partition=7}": 2},
                   "histograms": {"turn_seconds": {"count": 2, "sum": 0.5}},
                   "quantiles": {"turn_seconds": {"0.5": 1.0}}, "last_error": {"kind": "decode", "at_ns": 1},
                   "started_ns": None}
    assert redact_snapshot("not a dict")["counters"] == {}


def test_redact_status_document() -> None:
    doc = redact_status({"schedulers": [{"scheduler": "a"}], "pid": -1, "uptime_s": "x", "ready": 1,
                         "argv": [SECRET]})
    assert set(doc) == STATUS_KEYS and doc["pid"] is None and doc["uptime_s"] is None
    assert doc["ready"] is None  # 1 is not a bool: not a readiness answer
    assert redact_status({"schedulers": [], "ready": True})["ready"] is True


def test_render_prometheus_merges_schedulers_and_skips_collisions() -> None:
    a, a_again, b = Metrics("a"), Metrics("a"), Metrics("b")
    a.inc("x")
    a_again.inc("x", 9)  # a second Metrics of scheduler "a": its series would duplicate a's
    b.set_gauge("x", 2.0)  # "x" is a counter in a: one family name, two types: b's is skipped
    b.inc("y")
    b.set_gauge("committed_offset", math.inf, partition="0")
    b.set_gauge("lag", math.nan)
    b.observe("turn_seconds", 0.5)
    a.set_gauge("turn_seconds", 1.0)  # a gauge where b has a histogram: a's wins, b's is skipped
    families = parse_prometheus(render_prometheus([a, a_again, b]).decode())
    assert [s[2] for s in families["streamsched_x_total"]["samples"]] == ["1.0"]
    assert "streamsched_x" not in families and families["streamsched_y_total"]["type"] == "counter"
    assert [s[2] for s in families["streamsched_committed_offset"]["samples"]] == ["+Inf"]
    assert [s[2] for s in families["streamsched_lag"]["samples"]] == ["NaN"]
    assert families["streamsched_turn_seconds"]["type"] == "gauge"
    assert {s[1]["scheduler"] for s in families["streamsched_turn_seconds"]["samples"]} == {"a"}
    assert render_prometheus([]) == b""


# ------------------------------------------------------------------------------------------ fuzz

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _json_scalars,
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=12), children, max_size=4)),
    max_leaves=25,
)
_names = (st.sampled_from(["claims", "turn_seconds", "x", "Bad", "a-b", "", "é", "errors{kind=decode}",
                           "c{partition=3}", "c{kind=A}", SECRET, f"c{{kind={SECRET}}}"])
          | st.text(max_size=8))
_snapshot_like = st.fixed_dictionaries({}, optional={
    "scheduler": _json | _names,
    "counters": st.dictionaries(_names, _json | st.integers(), max_size=6) | _json,
    "gauges": st.dictionaries(_names, _json | st.floats(), max_size=6) | _json,
    "histograms": st.dictionaries(_names, st.fixed_dictionaries({}, optional={"count": _json | st.integers(),
                                                                              "sum": _json | st.floats()}),
                                  max_size=3) | _json,
    "quantiles": st.dictionaries(_names, st.dictionaries(st.sampled_from(["0.5", "0.99", "0.9", "x"]), _json),
                                 max_size=3) | _json,
    "last_error": st.fixed_dictionaries({}, optional={
        "type": _names | _json, "kind": _names | _json, "at_ns": st.integers() | _json, "message": _json,
    }) | _json,
    "started_ns": st.integers() | _json,
    "payload": _json,
})

_SERIES = re.compile(r"[a-z][a-z0-9_]*(\{[a-z]+=[a-z0-9_]+(,[a-z]+=[a-z0-9_]+)*\})?", re.ASCII)


def assert_safe(out: dict[str, Any]) -> None:
    assert set(out) == SNAPSHOT_KEYS
    assert out["scheduler"] == "<redacted>" or re.fullmatch(r"[A-Za-z0-9._-]+", out["scheduler"], re.ASCII)
    for k, v in out["counters"].items():
        assert _SERIES.fullmatch(k) and type(v) is int
    for k, v in out["gauges"].items():
        assert _SERIES.fullmatch(k) and type(v) in (int, float)
    for k, h in out["histograms"].items():
        assert _SERIES.fullmatch(k) and set(h) == {"count", "sum"} and type(h["count"]) is int
    for k, qs in out["quantiles"].items():
        assert k.split("{")[0].endswith("_seconds") and qs and set(qs) <= {"0.5", "0.99"}
        assert all(type(v) is float for v in qs.values())
    err = out["last_error"]
    if err is not None:
        assert err and set(err) <= {"type", "kind", "at_ns"}
        assert "type" not in err or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", err["type"], re.ASCII)
        assert "kind" not in err or re.fullmatch(r"[a-z_]+", err["kind"], re.ASCII)
        assert "at_ns" not in err or type(err["at_ns"]) is int
    assert out["started_ns"] is None or type(out["started_ns"]) is int


@settings(max_examples=400, deadline=None)
@given(st.one_of(_json, _snapshot_like))
def test_redact_snapshot_fuzz(snapshot: object) -> None:
    out = redact_snapshot(snapshot)
    assert_safe(out)
    has_nan = any(isinstance(v, float) and math.isnan(v) for v in out["gauges"].values()) or any(
        math.isnan(h["sum"]) for h in out["histograms"].values())
    assert redact_snapshot(out) == out or has_nan
    json_dumps(out)  # always serializable: ints are bounded to 64 bits
    assert SECRET not in json_dumps(out).decode() + format_status({"schedulers": [snapshot]})


@settings(max_examples=200, deadline=None)
@given(_json | st.fixed_dictionaries({"schedulers": st.lists(_snapshot_like, max_size=3),
                                      "pid": _json, "uptime_s": _json, "ready": _json}))
def test_format_status_is_total(doc: object) -> None:
    table = format_status(doc)
    assert table.endswith("\n") and SECRET not in table
    redacted = redact_status(doc)
    for snap in redacted["schedulers"]:
        assert_safe(snap)
