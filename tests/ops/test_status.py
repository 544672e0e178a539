"""streamsched.ops.status: the aiohttp status server (/metrics, /status, /healthz, /readyz), its client,
the CLI's table, and the redaction every one of them enforces (no broker)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import orjson
import pytest
from prom_text import parse_prometheus
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from streamsched.errors import ConfigError, DecodeError, StreamschedError
from streamsched.metrics import Metrics
from streamsched.ops.cli import build_parser, main
from streamsched.ops.status import StatusServer, StatusUnavailable, fetch_status, format_status, redact_status

# Uppercase, ':' and '/' keep the marker outside every grammar a served document allows.
SECRET = "Hunter2:SECRET/card-4111"


class Rogue(Collector):
    """A collector that is not ours, registered on a Metrics registry by mistake: full of data."""

    def collect(self) -> Iterable[Metric]:
        leak = GaugeMetricFamily("streamsched_leak", f"help {SECRET}", labels=["scheduler", "kind"])
        leak.add_metric(["pipelines", SECRET], 1.0)
        leak.add_metric(["pipelines", "ok"], 2.0)  # fits the vocabulary: served, with our HELP text
        claims = CounterMetricFamily("streamsched_claims", SECRET, labels=["scheduler"])
        claims.add_metric([SECRET], 1)
        claims.add_metric(["pipelines"], 99)  # the same series as pipelines' own claims: skipped
        tenant = CounterMetricFamily("streamsched_effects", "x", labels=["scheduler", "tenant"])
        tenant.add_metric(["pipelines", SECRET], 1)
        clash = GaugeMetricFamily("streamsched_turn_seconds", "x", labels=["scheduler"])
        clash.add_metric(["pipelines"], 5.0)  # a histogram elsewhere: a second type is never served
        return [leak, claims, tenant, clash, GaugeMetricFamily(f"hunter2_{SECRET[:7].lower()}", "x", value=1),
                InfoMetricFamily("streamsched_build", SECRET, value={"v": SECRET})]


def populated() -> list[Metrics]:
    a = Metrics("charge_due")
    a.inc("claims", 3)
    a.inc("effects")
    a.set_gauge("partitions", 2)
    a.set_gauge("lag_ratio", 0.25)
    a.set_gauge("committed_offset", 17, partition="0")
    for ms in range(1, 101):
        a.observe("turn_seconds", ms / 1000)
    a.error(DecodeError(f"payload {SECRET}"))
    b = Metrics("pipelines")
    b.inc("claims", 7)
    b.error(ValueError(f"token={SECRET}"))
    # Things the framework never does; none of it may come out.
    b.inc(f"user_{SECRET}")
    b.set_gauge(f"g_{SECRET}", 1.0)
    b.inc("terminal", kind=SECRET)
    b.registry.register(Rogue())
    return [a, b]


class Flag:
    def __init__(self) -> None:
        self.value: bool | Exception = True

    def __call__(self) -> bool:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.fixture
def ready() -> Flag:
    return Flag()


@pytest.fixture
async def server(ready: Flag) -> AsyncIterator[StatusServer]:
    async with StatusServer(populated(), port=0, ready=ready, read_timeout_s=0.5) as srv:
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


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    return status, headers, body


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    raw = await raw_request(port, request.encode())
    return parse_response(raw)


# ------------------------------------------------------------------------------------ endpoints


async def test_status_json(server: StatusServer) -> None:
    status, headers, body = await get(server.port, "/status")
    assert status == 200 and headers["content-type"].startswith("application/json")
    doc = orjson.loads(body)
    assert set(doc) == {"schedulers", "pid", "uptime_s", "ready"}
    assert isinstance(doc["pid"], int) and doc["uptime_s"] >= 0 and doc["ready"] is True
    a, b = doc["schedulers"]
    assert a["scheduler"] == "charge_due"
    assert a["counters"] == {"claims": 3, "effects": 1, "errors{kind=decode}": 1}
    assert a["gauges"] == {"partitions": 2, "lag_ratio": 0.25, "committed_offset{partition=0}": 17}
    assert a["histograms"]["turn_seconds"]["count"] == 100
    assert a["histograms"]["turn_seconds"]["sum"] == pytest.approx(5.05)
    assert a["quantiles"] == {"turn_seconds": {"0.5": 0.051, "0.99": 0.1}}
    assert a["last_error"]["type"] == "DecodeError" and a["last_error"]["kind"] == "decode"
    assert isinstance(a["last_error"]["at_ns"], int)
    assert b["counters"] == {"claims": 7, "errors{kind=internal}": 1, "metrics_dropped{reason=vocabulary}": 3}
    assert b["gauges"] == {} and b["histograms"] == {}
    assert b["last_error"]["type"] == "ValueError" and b["last_error"]["kind"] == "internal"


async def test_metrics_prometheus(server: StatusServer) -> None:
    status, headers, body = await get(server.port, "/metrics")
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = parse_prometheus(body.decode("utf-8"))
    assert all(name.startswith("streamsched_") for name in families)
    claims = families["streamsched_claims_total"]
    assert claims["type"] == "counter"
    assert {(s[1]["scheduler"], float(s[2])) for s in claims["samples"]} == {("charge_due", 3),
                                                                             ("pipelines", 7)}
    errors = families["streamsched_errors_total"]["samples"]
    assert {tuple(sorted(s[1])) for s in errors} == {("kind", "scheduler")}
    offsets = families["streamsched_committed_offset"]
    assert offsets["type"] == "gauge" and [s[1]["partition"] for s in offsets["samples"]] == ["0"]
    turn = families["streamsched_turn_seconds"]
    assert turn["type"] == "histogram"
    series = {s[0]: float(s[2]) for s in turn["samples"] if s[1].get("le") in (None, "+Inf")}
    assert series["streamsched_turn_seconds_count"] == series["streamsched_turn_seconds_bucket"] == 100
    assert series["streamsched_turn_seconds_sum"] == pytest.approx(5.05)
    assert all(s[1]["scheduler"] == "charge_due" for s in turn["samples"])  # the rogue gauge clash is gone
    leak = families["streamsched_leak"]
    assert [(s[1], s[2]) for s in leak["samples"]] == [({"kind": "ok", "scheduler": "pipelines"}, "2.0")]
    assert leak["help"] == "streamsched gauge leak"
    assert not any(name.endswith("_created") for name in families)


async def test_healthz_and_readyz(server: StatusServer, ready: Flag) -> None:
    assert (await get(server.port, "/healthz"))[::2] == (200, b"ok\n")
    assert (await get(server.port, "/readyz"))[::2] == (200, b"ready\n")
    ready.value = False
    assert (await get(server.port, "/readyz"))[::2] == (503, b"not ready\n")
    assert orjson.loads((await get(server.port, "/status"))[2])["ready"] is False
    assert (await get(server.port, "/healthz"))[0] == 200  # alive while not ready
    ready.value = RuntimeError(SECRET)  # a failing readiness check is "not ready", never a 500
    assert (await get(server.port, "/readyz"))[::2] == (503, b"not ready\n")
    async with StatusServer([], port=0) as plain:  # no readiness source: ready while alive
        assert (await get(plain.port, "/readyz"))[0] == 200


async def test_unknown_paths_and_methods(server: StatusServer) -> None:
    assert (await get(server.port, "/nope"))[0] == 404
    assert (await get(server.port, "/status/"))[0] == 404
    status, headers, _ = await get(server.port, "/status", method="POST")
    assert status == 405 and "GET" in headers["allow"]
    assert (await get(server.port, "/metrics", method="DELETE"))[0] == 405
    raw = await raw_request(server.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.endswith(b"\r\n\r\n")  # headers only


async def test_every_answer_carries_the_safety_headers(server: StatusServer) -> None:
    for path, method in (("/status", "GET"), ("/metrics", "GET"), ("/readyz", "GET"), ("/nope", "GET"),
                         ("/status", "POST")):
        _, headers, _ = await get(server.port, path, method)
        assert headers["cache-control"] == "no-store" and headers["x-content-type-options"] == "nosniff"
        assert headers["server"] == "streamsched"  # not aiohttp's, which names versions


@pytest.mark.parametrize("request_bytes", [
    b"GET /status HTTP/1.1\r\n\r\n",                              # no Host in HTTP/1.1
    b"GET /status HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",        # two Hosts
    b"GET /status HTTP/1.1\nHost: x\n\n",                         # bare LF
    b"GET /status HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",       # obs-fold
    b"GET /status HTTP/1.1\r\nHost : x\r\n\r\n",                  # space before colon
    b"GET /st\xc3\xa4tus HTTP/1.1\r\nHost: x\r\n\r\n",            # non-ASCII
    b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"garbage\r\n\r\n",
])
async def test_malformed_requests_are_400(server: StatusServer, request_bytes: bytes) -> None:
    status, _, body = parse_response(await raw_request(server.port, request_bytes))
    assert status == 400 and b"schedulers" not in body and b"charge_due" not in body


async def test_oversize_request_is_refused_and_closed(server: StatusServer) -> None:
    big = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    raw = await raw_request(server.port, big)  # returns only once the server closed
    assert parse_response(raw)[0] in (400, 431)
    many = b"GET /status HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n"
    assert parse_response(await raw_request(server.port, many))[0] in (400, 431)


@pytest.mark.parametrize("data", [b"GET /status HTTP/1.1\r\n", b""], ids=["slow", "silent"])
async def test_slow_or_silent_client_is_closed_after_timeout(server: StatusServer, data: bytes) -> None:
    start = time.monotonic()
    raw = await raw_request(server.port, data, read_timeout=5.0)
    assert 0.4 <= time.monotonic() - start < 3.0
    assert raw == b"" or parse_response(raw)[0] == 408


async def test_stop_closes_open_connections() -> None:
    srv = StatusServer([Metrics("s")], port=0, read_timeout_s=30)
    await srv.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"GET /status")
    await writer.drain()
    async with asyncio.timeout(5):
        assert srv._runner is not None
        while not srv._runner.server.connections:  # until the server accepted it
            await asyncio.sleep(0.005)
        await srv.stop()
        assert await reader.read() == b""
    writer.close()
    await srv.stop()  # idempotent


async def test_host_and_port_are_configurable() -> None:
    async with StatusServer([Metrics("s")], host="0.0.0.0", port=0) as srv:  # a container's choice
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        assert (await fetch_status(srv.url))["schedulers"][0]["scheduler"] == "s"
        with pytest.raises(ConfigError, match="cannot bind"):
            await StatusServer([], host="0.0.0.0", port=srv.port).start()
    for host in ("status.example.com", f"127.0.0.1 {SECRET}", ""):
        with pytest.raises(ConfigError):
            StatusServer([], host=host)
    with pytest.raises(ConfigError):
        StatusServer([], port=70000)


async def test_a_failing_handler_answers_500_without_details(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Metrics):
        def snapshot(self) -> dict[str, Any]:
            raise RuntimeError(SECRET)

    caplog.set_level(logging.DEBUG)
    async with StatusServer([Broken("s")], port=0) as srv:
        status, _, body = await get(srv.port, "/status")
        assert status == 500 and SECRET.encode() not in body
        assert (await get(srv.port, "/metrics"))[0] == 200  # the exposition does not need snapshot()
    assert SECRET not in caplog.text and "RuntimeError" in caplog.text


# ---------------------------------------------------------------------------------------- client


async def test_fetch_status_round_trip(server: StatusServer) -> None:
    doc = await fetch_status(server.url)
    assert [s["scheduler"] for s in doc["schedulers"]] == ["charge_due", "pipelines"]
    assert doc["schedulers"][0]["counters"]["claims"] == 3 and doc["ready"] is True
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
    assert info.value.url == f"http://127.0.0.1:{port}/" and "cannot connect" in str(info.value)
    assert "Hunter2" not in str(info.value) and "token" not in str(info.value)
    with pytest.raises(StatusUnavailable) as info:  # '/' ends the authority: an invalid port
        await fetch_status(f"http://user:{SECRET}@127.0.0.1:{port}", timeout=2)
    assert "Hunter2" not in str(info.value) and "Hunter2" not in info.value.url
    for bad in ("https://127.0.0.1:1", "http://127.0.0.1:1/a b", "ftp://x:1"):
        with pytest.raises(StatusUnavailable, match="invalid url"):
            await fetch_status(bad)


@contextlib.asynccontextmanager
async def fake_server(response: bytes) -> AsyncIterator[str]:
    """A TCP server answering every request with ``response`` bytes, then closing."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
        writer.close()

    fake = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with fake:
        yield f"http://127.0.0.1:{fake.sockets[0].getsockname()[1]}"


async def test_fetch_status_bad_responses(server: StatusServer) -> None:
    with pytest.raises(StatusUnavailable) as info:
        await fetch_status(server.url + "/nope")
    assert info.value.status == 404
    answers = {
        b"HTTP/1.1 200 OK\r\nContent-Length: 34\r\n\r\nnot json {" + SECRET.encode(): "not a status document",
        # Bytes after the declared length.
        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nnot json {" + SECRET.encode(): "unavailable",
        b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"a": 1}\n': "not a status document",
        # No redirect is followed: the answer must come from the address the operator named.
        f"HTTP/1.1 302 Found\r\nLocation: {server.url}/status\r\nContent-Length: 0\r\n\r\n".encode():
            "HTTP 302",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n{": "too large",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{" + SECRET.encode(): "invalid response",
        b"garbage " + SECRET.encode() + b"\r\n\r\n": "invalid response",
    }
    for response, reason in answers.items():
        async with fake_server(response) as url:
            with pytest.raises(StatusUnavailable, match=reason) as info:
                await fetch_status(url, timeout=5)
            assert SECRET not in str(info.value) and info.value.__cause__ is None


async def test_fetch_status_reads_a_bounded_body() -> None:
    # 5 MiB in 1 MiB chunks with no Content-Length: the client stops reading at its bound.
    chunk = b"100000\r\n" + b"[" * 0x100000 + b"\r\n"
    async with fake_server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 5) as url:
        with pytest.raises(StatusUnavailable, match="too large"):
            await fetch_status(url, timeout=5)


async def test_fetch_status_timeout() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    fake = await asyncio.start_server(hang, "127.0.0.1", 0)
    async with fake:
        port = fake.sockets[0].getsockname()[1]
        with pytest.raises(StatusUnavailable, match="timed out"):
            await fetch_status(f"http://127.0.0.1:{port}", timeout=0.2)
        fake.close()


# ------------------------------------------------------------------------------------------- cli


@contextlib.contextmanager
def server_in_thread(metrics: list[Metrics]) -> Iterator[StatusServer]:
    """A StatusServer on its own loop in a thread: the CLI runs asyncio.run itself."""
    loop = asyncio.new_event_loop()
    srv = StatusServer(metrics, port=0)
    loop.run_until_complete(srv.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_cli_status_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    with server_in_thread(populated()) as srv:
        assert main(["status", srv.url]) == 0
        table = capsys.readouterr().out
        assert main(["status", "--url", srv.url, "-o", "json"]) == 0
        doc = orjson.loads(capsys.readouterr().out)
    assert "ready yes" in table and "scheduler charge_due" in table and "scheduler pipelines" in table
    assert "turn_seconds: n 100  mean 50.5ms  p50 51ms  p99 100ms" in table
    assert "terminal" not in table and SECRET not in table
    assert doc == redact_status(doc) and len(doc["schedulers"]) == 2
    assert main(["status", f"http://user:{SECRET}@127.0.0.1:{closed_port()}/"]) == 1
    err = capsys.readouterr().err
    assert "status unavailable" in err and "Hunter2" not in err and "Traceback" not in err


def test_status_options_of_run_and_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMSCHED_STATUS_HOST", raising=False)
    monkeypatch.setenv("STREAMSCHED_STATUS_PORT", "9464")
    run = build_parser().parse_args(["run", "--app", "m:app"])
    assert (run.status_host, run.status_port) == ("127.0.0.1", 9464)  # loopback unless told otherwise
    tick = build_parser().parse_args(["schedule", "tick"])
    assert tick.status_port is None  # the env port is the worker's: a ticker beside it must not take it
    tick = build_parser().parse_args(["schedule", "tick", "--status-port", "9465",
                                      "--status-host", "0.0.0.0"])
    assert (tick.status_host, tick.status_port) == ("0.0.0.0", 9465)


# ------------------------------------------------------------------------------------- redaction


async def test_secret_never_served(server: StatusServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    outputs = []
    for path in ("/status", "/metrics", "/healthz", "/readyz", "/nope", f"/status?token={SECRET[:7]}"):
        _, headers, body = await get(server.port, path)
        outputs.append(body.decode("utf-8") + repr(headers))
    doc = await fetch_status(server.url)
    outputs += [format_status(doc), format_status(server.status_document())]
    # A malformed request with a secret in it: aiohttp's 400 may quote the client's own bytes
    # back to that client, but the log keeps the fact only.
    await raw_request(server.port, f"GARBAGE /{SECRET} HTTP/1.1\r\n\r\n".encode())
    for out in [*outputs, caplog.text]:
        assert SECRET not in out
        assert "Hunter2" not in out and "4111" not in out
    table = outputs[-1]
    assert "DecodeError (decode)" in table and "ValueError (internal)" in table
    assert table.index("claims") < table.index("effects")  # counters sorted


def test_the_table_names_each_circuit_breaker_and_its_state() -> None:
    m = Metrics("charge_due")
    m.set_gauge("breaker_state", 2, kind="charge")
    m.set_gauge("breaker_state", 0, kind="scheduler")
    table = format_status({"schedulers": [m.snapshot()], "pid": 1, "uptime_s": 1.0, "ready": True})
    assert "  circuit breakers: charge OPEN, scheduler closed\n" in table
    assert "circuit breakers" not in format_status({"schedulers": [Metrics("x").snapshot()]})
