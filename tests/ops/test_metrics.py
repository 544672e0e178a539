"""streamsched.metrics: label families on prometheus_client, seconds histograms, a closed and bounded
vocabulary (no broker)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from streamsched.errors import DecodeError, StreamschedError
from streamsched.metrics import MAX_FAMILIES, MAX_SERIES, Metrics, parse_series_key, series_key
from streamsched.model.jsonval import json_dumps

SECRET = "Hunter2:SECRET/card-4111"


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every exported sample of ``m``'s registry: (sample name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in m.registry.collect() for s in fam.samples}


def test_counters_and_gauges_are_label_families() -> None:
    m = Metrics("charge_due")
    m.inc("claims", 3)
    m.inc("terminal", kind="handler_terminal")
    m.inc("terminal", 2, kind="decode")
    m.set_gauge("committed_offset", 41, partition="0")
    m.set_gauge("committed_offset", 7, partition="1")
    got = samples(m)
    assert got[("streamsched_claims_total", (("scheduler", "charge_due"),))] == 3
    assert got[("streamsched_terminal_total", (("kind", "decode"), ("scheduler", "charge_due")))] == 2
    handler = (("kind", "handler_terminal"), ("scheduler", "charge_due"))
    assert got[("streamsched_terminal_total", handler)] == 1
    assert got[("streamsched_committed_offset", (("partition", "1"), ("scheduler", "charge_due")))] == 7
    assert m.counters == {"claims": 3, "terminal{kind=handler_terminal}": 1, "terminal{kind=decode}": 2}
    assert m.gauges == {"committed_offset{partition=0}": 41, "committed_offset{partition=1}": 7}
    text = generate_latest(m.registry).decode()
    assert 'streamsched_terminal_total{kind="decode",scheduler="charge_due"} 2.0' in text


def test_partition_spellings_are_one_series() -> None:
    m = Metrics("s")
    m.set_gauge("committed_offset", 1, partition="p3")
    m.set_gauge("committed_offset", 2, partition="3")
    m.set_gauge("committed_offset", 5, partition=4)  # type: ignore[arg-type]
    assert m.gauges == {"committed_offset{partition=3}": 2, "committed_offset{partition=4}": 5}


def test_latencies_are_seconds_histograms_and_ms_names_convert() -> None:
    m = Metrics("s")
    m.observe("turn_seconds", 0.004)
    m.observe("turn_ms", 6.0)  # the pre-seconds spelling: the same series, in milliseconds
    got = samples(m)
    base = (("scheduler", "s"),)
    assert got[("streamsched_turn_seconds_count", base)] == 2
    assert got[("streamsched_turn_seconds_sum", base)] == pytest.approx(0.010)
    assert got[("streamsched_turn_seconds_bucket", (("le", "0.005"), *base))] == 1
    assert got[("streamsched_turn_seconds_bucket", (("le", "0.01"), *base))] == 2
    assert not any(name.startswith("streamsched_turn_ms") for name, _ in got)
    assert m.percentile("turn_seconds", 0.99) == pytest.approx(0.006)
    assert m.percentile("turn_ms", 0.5) == pytest.approx(6.0)  # asked in ms, answered in ms
    assert m.percentile("end_txn_ms", 0.5) is None
    snap = m.snapshot()
    assert snap["histograms"] == {"turn_seconds": {"count": 2, "sum": pytest.approx(0.010)}}
    assert snap["quantiles"] == {"turn_seconds": {"0.5": pytest.approx(0.006), "0.99": pytest.approx(0.006)}}


def test_histograms_of_replicas_aggregate() -> None:
    # Two replicas' _sum and _count add up to the fleet's: what a summary of quantiles cannot do.
    a, b = Metrics("s"), Metrics("s")
    for v in (0.001, 0.002):
        a.observe("turn_seconds", v)
    b.observe("turn_seconds", 0.009)
    total = sum(samples(m)[("streamsched_turn_seconds_sum", (("scheduler", "s"),))] for m in (a, b))
    count = sum(samples(m)[("streamsched_turn_seconds_count", (("scheduler", "s"),))] for m in (a, b))
    assert count == 3 and total == pytest.approx(0.012)


def test_each_metrics_has_its_own_registry() -> None:
    a, b = Metrics("same"), Metrics("same")  # two workers of one scheduler in one process
    a.inc("claims")
    b.inc("claims", 5)
    assert a.counters == {"claims": 1} and b.counters == {"claims": 5}


@pytest.mark.parametrize(("call", "reason"), [
    (lambda m: m.inc("Claims"), "vocabulary"),
    (lambda m: m.inc(f"user_{SECRET}"), "vocabulary"),
    (lambda m: m.inc("claims_total"), "vocabulary"),          # Prometheus suffixes are reserved
    (lambda m: m.set_gauge("lag_count", 1), "vocabulary"),
    (lambda m: m.inc("turn_ms"), "vocabulary"),               # _ms is the latency alias only
    (lambda m: m.inc("claims", topic="t"), "vocabulary"),     # not a label name we allow
    (lambda m: m.inc("terminal", kind=SECRET), "vocabulary"),
    (lambda m: m.inc("terminal", kind="Decode"), "vocabulary"),
    (lambda m: m.set_gauge("committed_offset", 1, partition="p-1"), "vocabulary"),
    (lambda m: m.observe("turn", 0.1), "vocabulary"),          # a latency is named *_seconds
    (lambda m: m.observe("turn_seconds", 0.1, kind=SECRET), "vocabulary"),
    (lambda m: m.set_gauge("lag", SECRET), "value"),
    (lambda m: m.inc("claims", -1), "value"),
    (lambda m: m.inc("claims", math.inf), "value"),
    (lambda m: m.observe("turn_seconds", math.nan), "value"),  # would poison _sum for good
])
def test_outside_the_vocabulary_is_dropped_and_counted(call: Any, reason: str) -> None:
    m = Metrics("s")
    call(m)
    call(m)
    assert m.counters == {f"metrics_dropped{{reason={reason}}}": 2}
    assert m.gauges == {} and m.snapshot()["histograms"] == {}
    assert SECRET not in generate_latest(m.registry).decode() + json_dumps(m.snapshot()).decode()


def test_a_name_keeps_its_first_type_and_labels() -> None:
    m = Metrics("s")
    m.inc("lag")
    m.set_gauge("lag", 3)                 # counter first: a gauge of that name is refused
    m.inc("lag", partition="1")           # and so is a second set of label names
    m.inc("terminal", kind="decode")
    m.inc("terminal")
    assert m.counters == {"lag": 1, "terminal{kind=decode}": 1, "metrics_dropped{reason=type_conflict}": 1,
                          "metrics_dropped{reason=labels}": 2}


def test_cardinality_is_bounded() -> None:
    m = Metrics("s")
    for p in range(MAX_SERIES + 50):
        m.set_gauge("committed_offset", p, partition=str(p))
    assert len(m.gauges) == MAX_SERIES
    assert m.counters == {"metrics_dropped{reason=series}": 50}
    n = Metrics("s")
    for i in range(MAX_FAMILIES + 5):
        n.inc(f"c{i}")
    assert len(n.counters) == MAX_FAMILIES + 1  # + the dropped counter itself
    assert n.counters["metrics_dropped{reason=families}"] == 5


def test_error_keeps_type_and_kind_only() -> None:
    m = Metrics("s")
    m.error(DecodeError(f"payload {SECRET}"))
    assert m.last_error is not None and set(m.last_error) == {"type", "kind", "at_ns"}
    assert (m.last_error["type"], m.last_error["kind"]) == ("DecodeError", "decode")
    m.error(ValueError(SECRET))
    assert (m.last_error["type"], m.last_error["kind"]) == ("ValueError", "internal")

    class Odd(StreamschedError):
        kind = SECRET  # a careless subclass: its kind is not served as is

    m.error(Odd("x"))
    assert m.last_error["kind"] == "invalid"
    assert m.counters == {"errors{kind=decode}": 1, "errors{kind=internal}": 1, "errors{kind=invalid}": 1}
    assert SECRET not in json_dumps(m.snapshot()).decode()


def test_series_keys_round_trip_and_refuse_anything_else() -> None:
    key = series_key("terminal", [("partition", "3"), ("kind", "decode")])
    assert key == "terminal{kind=decode,partition=3}"
    assert parse_series_key(key) == ("terminal", {"kind": "decode", "partition": "3"})
    assert parse_series_key("claims") == ("claims", {})
    for bad in ("terminal{partition=3,kind=decode}", "x{kind=a", "x{topic=a}", "x{kind=A}", "x_total",
                "x{kind=a,kind=b}", "x{}", "", "X", SECRET, 5, None):
        assert parse_series_key(bad) is None, bad


_text = st.text(max_size=12) | st.sampled_from(["claims", "turn_ms", "turn_seconds", "p1", "3", "decode",
                                                 SECRET])
_labels = st.dictionaries(st.sampled_from(["partition", "kind", "reason", "topic", "scheduler", "le"]), _text,
                          max_size=3)
_value = st.integers(-5, 10**6) | st.floats(allow_nan=True) | st.just(SECRET)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["inc", "set_gauge", "observe"]), _text, _value, _labels),
                max_size=20))
def test_any_update_is_safe(updates: list[tuple[str, str, Any, dict[str, str]]]) -> None:
    m = Metrics("s")
    for method, name, value, labels in updates:
        if method == "inc" and not isinstance(value, int):
            value = 1
        getattr(m, method)(name, value, **labels)  # never raises
    snap = m.snapshot()
    for section in ("counters", "gauges", "histograms", "quantiles"):
        for key in snap[section]:
            assert parse_series_key(key) is not None, key
    assert SECRET not in json_dumps(snap).decode() + generate_latest(m.registry).decode()
    assert all(type(v) is int and v >= 0 for v in snap["counters"].values())
    assert all(not math.isnan(h["count"]) for h in snap["histograms"].values())
