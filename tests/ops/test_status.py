"""Tests for streamsched.status: the HTTP status endpoint, its client and its redaction (no broker)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.errors import DecodeError, StreamschedError
from streamsched.metrics import Metrics
from streamsched.model.jsonval import json_dumps
from streamsched.ops.status import (
    StatusServer,
    StatusUnavailable,
    fetch_status,
    format_status,
    redact_snapshot,
    redact_status,
    render_prometheus,
)

# Uppercase, ':' and '/' keep the marker outside every grammar a redacted snapshot allows.
SECRET = "Hunter2:SECRET/card-4111"


def populated() -> list[Metrics]:
    a = Metrics("charge_due")
    a.inc("claims", 3)
    a.inc("effects")
    a.set_gauge("partitions", 2)
    a.set_gauge("lag_ratio", 0.25)
    for ms in range(1, 101):
        a.observe("turn_ms", float(ms))
    a.error(DecodeError(f"payload {SECRET}"))
    b = Metrics("pipelines")
    b.inc("claims", 7)
    b.error(ValueError(f"token={SECRET}"))
    # Things the framework never does, but redaction must survive them anyway.
    b.inc(f"user_{SECRET}")
    b.set_gauge(f"g_{SECRET}", 1.0)
    b.gauges["leak"] = SECRET  # type: ignore[assignment]
    return [a, b]


@pytest.fixture
async def server() -> AsyncIterator[StatusServer]:
    async with StatusServer(populated(), port=0, read_timeout_s=0.5) as srv:
        yield srv


async def raw_request(port: int, data: bytes, *, read_timeout: float = 5.0) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        async with asyncio.timeout(read_timeout):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()
        with contextlib.suppress(OSError):  # a reset on close is fine: the response was read
            await writer.wait_closed()


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    raw = await raw_request(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return parse_response(raw)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return status, headers, body


# ---------------------------------------------------------------------------- prometheus parser

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?[0-9]+))?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')
_TYPES = {"counter", "gauge", "summary", "histogram", "untyped"}


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """Strict parser of text format 0.0.4; returns family -> {type, help, samples}."""
    assert text.endswith("\n")
    families: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    current: str | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if parts[1] not in ("HELP", "TYPE"):
                continue
            name = parts[2]
            assert _METRIC_NAME.fullmatch(name), line
            if name != current:
                assert name not in done and name not in families, f"family {name} split"
                if current is not None:
                    done.add(current)
                current = name
            fam = families.setdefault(name, {"samples": []})
            key = parts[1].lower()
            assert key not in fam, f"second {parts[1]} for {name}"
            assert not fam["samples"], f"{parts[1]} after samples of {name}"
            if parts[1] == "TYPE":
                assert parts[3] in _TYPES
            fam[key] = parts[3]
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"bad sample line {line!r}"
        name, labels_text, value = m.group(1), m.group(2) or "", m.group(3)
        assert current is not None, f"sample {name} without HELP/TYPE"
        fam = families[current]
        suffixes = ("", "_sum", "_count") if fam["type"] == "summary" else ("",)
        assert name in {current + s for s in suffixes}, f"{name} outside family {current}"
        labels: dict[str, str] = {}
        pos = 0
        while pos < len(labels_text):
            lm = _LABEL.match(labels_text, pos)
            assert lm, f"bad labels {labels_text!r}"
            assert lm.group(1) not in labels
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        float(value)  # raises for anything but a Go-style float, NaN, +Inf, -Inf
        fam["samples"].append((name, labels, value))
    for name, fam in families.items():
        assert "help" in fam and "type" in fam, f"{name} lacks HELP or TYPE"
        keys = [(*sorted(s[1].items()), s[0]) for s in fam["samples"]]
        assert len(keys) == len(set(keys)), f"duplicate series in {name}"
    return families


# ------------------------------------------------------------------------------------ endpoints


async def test_status_json(server: StatusServer) -> None:
    status, headers, body = await get(server.port, "/status")
    assert status == 200 and headers["content-type"] == "application/json"
    doc = orjson.loads(body)
    assert set(doc) == {"schedulers", "pid", "uptime_s"}
    assert isinstance(doc["pid"], int) and doc["uptime_s"] >= 0
    a, b = doc["schedulers"]
    assert a["scheduler"] == "charge_due"
    assert a["counters"] == {"claims": 3, "effects": 1, "errors_decode": 1}
    assert a["gauges"] == {"partitions": 2, "lag_ratio": 0.25}
    assert a["quantiles"] == {"turn_ms": {"0.5": 51.0, "0.99": 100.0}}
    assert a["last_error"]["type"] == "DecodeError" and a["last_error"]["kind"] == "decode"
    assert isinstance(a["last_error"]["at_ns"], int)
    assert b["counters"] == {"claims": 7, "errors_internal": 1}
    assert b["gauges"] == {}
    assert b["last_error"]["type"] == "ValueError" and b["last_error"]["kind"] == "internal"


async def test_metrics_prometheus(server: StatusServer) -> None:
    status, headers, body = await get(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    families = parse_prometheus(body.decode("utf-8"))
    claims = families["streamsched_claims_total"]
    assert claims["type"] == "counter"
    assert {(s[1]["scheduler"], s[2]) for s in claims["samples"]} == {("charge_due", "3"), ("pipelines", "7")}
    assert families["streamsched_partitions"]["type"] == "gauge"
    turn = families["streamsched_turn_ms"]
    assert turn["type"] == "summary"
    assert {(s[1]["quantile"], float(s[2])) for s in turn["samples"]} == {("0.5", 51.0), ("0.99", 100.0)}
    assert all(s[1]["scheduler"] == "charge_due" for s in turn["samples"])


async def test_healthz_and_errors(server: StatusServer) -> None:
    status, _, body = await get(server.port, "/healthz")
    assert (status, body.strip()) == (200, b"ok")
    assert (await get(server.port, "/nope"))[0] == 404
    assert (await get(server.port, "/status/"))[0] == 404
    status, headers, _ = await get(server.port, "/status", method="POST")
    assert status == 405 and headers["allow"] == "GET"
    assert (await get(server.port, "/status", method="DELETE"))[0] == 405


@pytest.mark.parametrize("request_bytes", [
    b"GET /status HTTP/1.1\r\n\r\n",                              # no Host in HTTP/1.1
    b"GET /status HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",        # two Hosts
    b"GET /status HTTP/1.1\nHost: x\n\n",                         # bare LF
    b"GET /status HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",       # obs-fold
    b"GET /status HTTP/1.1\r\nHost : x\r\n\r\n",                  # space before colon
    b"GET  /status HTTP/1.1\r\nHost: x\r\n\r\n",                  # double space
    b"GET http://x/status HTTP/1.1\r\nHost: x\r\n\r\n",           # absolute form
    b"GET /st\xc3\xa4tus HTTP/1.1\r\nHost: x\r\n\r\n",            # non-ASCII
    b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"GET /status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"garbage\r\n\r\n",
])
async def test_malformed_requests_are_400(server: StatusServer, request_bytes: bytes) -> None:
    status, _, _ = parse_response(await raw_request(server.port, request_bytes))
    assert status == 400


async def test_http_version(server: StatusServer) -> None:
    raw = await raw_request(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert parse_response(raw)[0] == 200  # HTTP/1.0 needs no Host
    raw = await raw_request(server.port, b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n")
    assert parse_response(raw)[0] == 505


async def test_oversize_request_is_refused_and_closed(server: StatusServer) -> None:
    big = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    raw = await raw_request(server.port, big)  # returns only once the server closed
    assert parse_response(raw)[0] in (400, 431)
    many = b"GET /status HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n"
    assert parse_response(await raw_request(server.port, many))[0] in (400, 431)


async def test_slow_client_is_closed_after_timeout(server: StatusServer) -> None:
    start = time.monotonic()
    raw = await raw_request(server.port, b"GET /status HTTP/1.1\r\n", read_timeout=5.0)
    elapsed = time.monotonic() - start
    assert 0.4 <= elapsed < 3.0
    assert raw == b"" or parse_response(raw)[0] == 408


async def test_silent_connection_is_closed(server: StatusServer) -> None:
    start = time.monotonic()
    raw = await raw_request(server.port, b"")  # connect, send nothing
    assert raw == b"" or parse_response(raw)[0] == 408
    assert time.monotonic() - start < 3.0


async def test_stop_aborts_open_connections() -> None:
    srv = StatusServer([Metrics("s")], port=0, read_timeout_s=30)
    await srv.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"GET /status")
    await writer.drain()
    await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        await srv.stop()
        assert await reader.read() == b""
    writer.close()
    await srv.stop()  # idempotent


# ---------------------------------------------------------------------------------------- client


async def test_fetch_status_round_trip(server: StatusServer) -> None:
    doc = await fetch_status(server.url)
    assert [s["scheduler"] for s in doc["schedulers"]] == ["charge_due", "pipelines"]
    assert doc["schedulers"][0]["counters"]["claims"] == 3
    assert doc == redact_status(doc)
    # Bare host:port, a trailing slash and an explicit /status all reach the same document.
    for url in (f"127.0.0.1:{server.port}", server.url + "/", server.url + "/status"):
        assert (await fetch_status(url))["schedulers"] == doc["schedulers"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_fetch_status_unavailable() -> None:
    port = closed_port()
    with pytest.raises(StatusUnavailable) as info:
        await fetch_status(f"http://user:pw-Hunter2@127.0.0.1:{port}/?token=x", timeout=2)
    assert isinstance(info.value, StreamschedError) and info.value.status is None
    assert info.value.url == f"http://127.0.0.1:{port}/"
    assert "Hunter2" not in str(info.value) and "token" not in str(info.value)
    with pytest.raises(StatusUnavailable) as info:  # '/' ends the authority: an invalid port
        await fetch_status(f"http://user:{SECRET}@127.0.0.1:{port}", timeout=2)
    assert "Hunter2" not in str(info.value) and "Hunter2" not in info.value.url
    with pytest.raises(StatusUnavailable):
        await fetch_status("https://127.0.0.1:1")
    with pytest.raises(StatusUnavailable):
        await fetch_status("http://127.0.0.1:1/a b")


async def test_fetch_status_bad_responses(server: StatusServer) -> None:
    with pytest.raises(StatusUnavailable) as info:
        await fetch_status(server.url + "/nope")
    assert info.value.status == 404

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nnot json {" + SECRET.encode())
        await writer.drain()
        writer.close()

    fake = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with fake:
        port = fake.sockets[0].getsockname()[1]
        with pytest.raises(StatusUnavailable) as info:
            await fetch_status(f"http://127.0.0.1:{port}")
        assert SECRET not in str(info.value)


async def test_fetch_status_timeout() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    fake = await asyncio.start_server(hang, "127.0.0.1", 0)
    async with fake:
        port = fake.sockets[0].getsockname()[1]
        with pytest.raises(StatusUnavailable, match="timed out"):
            await fetch_status(f"http://127.0.0.1:{port}", timeout=0.2)
        fake.close()


# ------------------------------------------------------------------------------------- redaction


async def test_secret_never_served(server: StatusServer) -> None:
    outputs = []
    for path in ("/status", "/metrics", "/healthz", "/nope"):
        _, _, body = await get(server.port, path)
        outputs.append(body.decode("utf-8"))
    doc = await fetch_status(server.url)
    outputs.append(format_status(doc))
    outputs.append(format_status(server.status_document()))
    for out in outputs:
        assert SECRET not in out
        assert "Hunter2" not in out and "4111" not in out
    table = outputs[-1]
    assert "scheduler charge_due" in table and "scheduler pipelines" in table
    assert "DecodeError (decode)" in table and "ValueError (internal)" in table
    assert table.index("claims") < table.index("effects")  # counters sorted
    assert "p50 51" in table and "p99 100" in table


def test_redact_snapshot_keeps_safe_data() -> None:
    m = Metrics("charge_due")
    m.inc("claims")
    m.set_gauge("partitions", 3)
    m.error(DecodeError("x"))
    snap = m.snapshot()
    out = redact_snapshot(snap)
    assert out["counters"] == snap["counters"] and out["gauges"] == snap["gauges"]
    assert out["last_error"] == snap["last_error"] and out["started_ns"] == snap["started_ns"]
    assert out["scheduler"] == "charge_due" and out["quantiles"] == {}


def test_redact_snapshot_drops_unsafe_data() -> None:
    class Sneaky(int):
        def __repr__(self) -> str:
            return SECRET

        __str__ = __repr__

    out = redact_snapshot({
        "scheduler": f"bad {SECRET}",
        "counters": {"ok": 1, "Bad": 2, "x-y": 3, "flag": True, "big": 2**70, "sneaky": Sneaky(1),
                     "float": 1.5, 5: 5},
        "gauges": {"g": 1.5, "s": SECRET, "n": None, "nested": {"a": 1}},
        "quantiles": {"turn_ms": {"0.5": 1.0, "0.9": 2.0, "0.99": "x"}, "other": {"0.5": 1.0}},
        "last_error": {"type": "Bad Type", "kind": "decode", "at_ns": 1, "message": SECRET},
        "started_ns": "now",
        "payload": SECRET,
    })
    assert out == {"scheduler": "<redacted>", "counters": {"ok": 1}, "gauges": {"g": 1.5},
                   "quantiles": {"turn_ms": {"0.5": 1.0}}, "last_error": {"kind": "decode", "at_ns": 1},
                   "started_ns": None}
    assert redact_snapshot("not a dict")["counters"] == {}


def test_render_prometheus_collisions_and_escaping() -> None:
    snaps = [
        {"scheduler": "a", "counters": {"x": 1}, "gauges": {"x_total": 2.0, "turn_ms": 1.0, "inf": math.inf},
         "quantiles": {"turn_ms": {"0.5": 3.0}}},
        {"scheduler": "a", "counters": {"x": 9}},  # same scheduler twice: first one wins
        {"scheduler": "b", "gauges": {"nan": math.nan}},
    ]
    text = render_prometheus(snaps)
    families = parse_prometheus(text)
    assert families["streamsched_x_total"]["type"] == "counter"
    assert [s[2] for s in families["streamsched_x_total"]["samples"]] == ["1"]
    assert families["streamsched_turn_ms"]["type"] == "summary"
    assert [s[2] for s in families["streamsched_inf"]["samples"]] == ["+Inf"]
    assert [s[2] for s in families["streamsched_nan"]["samples"]] == ["NaN"]
    assert render_prometheus([]) == ""


# ------------------------------------------------------------------------------------------ fuzz

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _json_scalars,
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=12), children, max_size=4)),
    max_leaves=25,
)
_names = (st.sampled_from(["claims", "turn_ms", "x", "Bad", "a-b", "", "é", "errors_decode", SECRET])
          | st.text(max_size=8))
_snapshot_like = st.fixed_dictionaries({}, optional={
    "scheduler": _json | _names,
    "counters": st.dictionaries(_names, _json | st.integers(), max_size=6) | _json,
    "gauges": st.dictionaries(_names, _json | st.floats(), max_size=6) | _json,
    "quantiles": st.dictionaries(_names, st.dictionaries(st.sampled_from(["0.5", "0.99", "0.9", "x"]), _json),
                                 max_size=3) | _json,
    "last_error": st.fixed_dictionaries({}, optional={
        "type": _names | _json, "kind": _names | _json, "at_ns": st.integers() | _json, "message": _json,
    }) | _json,
    "started_ns": st.integers() | _json,
    "payload": _json,
})

_SAFE_NAME = re.compile(r"[a-z0-9_]+", re.ASCII)


def assert_safe(out: dict[str, Any]) -> None:
    assert set(out) == {"scheduler", "counters", "gauges", "quantiles", "last_error", "started_ns"}
    assert out["scheduler"] == "<redacted>" or re.fullmatch(r"[A-Za-z0-9._-]+", out["scheduler"], re.ASCII)
    for k, v in out["counters"].items():
        assert _SAFE_NAME.fullmatch(k) and type(v) is int
    for k, v in out["gauges"].items():
        assert _SAFE_NAME.fullmatch(k) and type(v) in (int, float)
    for k, qs in out["quantiles"].items():
        assert k == "turn_ms" and qs and set(qs) <= {"0.5", "0.99"}
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
    assert redact_snapshot(out) == out or any(isinstance(v, float) and math.isnan(v)
                                             for v in out["gauges"].values())
    json_dumps(out)  # always serializable: ints are bounded to 64 bits
    text = render_prometheus([out])
    parse_prometheus(text) if text else None
    assert SECRET not in json_dumps(out).decode() + text + format_status({"schedulers": [snapshot]})


@settings(max_examples=200, deadline=None)
@given(_json | st.fixed_dictionaries({"schedulers": st.lists(_snapshot_like, max_size=3),
                                      "pid": _json, "uptime_s": _json}))
def test_format_status_is_total(doc: object) -> None:
    table = format_status(doc)
    assert table.endswith("\n") and SECRET not in table
    redacted = redact_status(doc)
    for snap in redacted["schedulers"]:
        assert_safe(snap)
