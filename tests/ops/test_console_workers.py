"""``streamsched console --worker URL``: the schedulers page shows what each worker keeps in
memory (circuit breakers and how often they opened, pause, rate budget, ready) as its real
status server serves it, a worker that does not answer as "unreachable" without failing the
page, never a URL's credentials; workers are asked at once with a short deadline; a bad
``--worker`` is one line (ConfigError, exit 2)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from streamsched.errors import ConfigError
from streamsched.metrics import Metrics
from streamsched.ops.cli import main
from streamsched.ops.console import Console, ConsoleConfig
from streamsched.ops.console.app import build_app
from streamsched.ops.console.workers import Worker, fetch_reports, table_for
from streamsched.ops.status import StatusServer
from tests.conftest import TopicFactory, failing_scheduler

UNREACHABLE = "127.0.0.1:1"  # refused at once
SECRET = "Hunter2pw"


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port that accepts connections and never answers (a worker stuck or behind a dead
    proxy): only the client's deadline ends the request."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in held:
            w.close()
        await server.wait_closed()


def worker_metrics(scheduler: str) -> Metrics:
    m = Metrics(scheduler)
    m.set_gauge("breaker_state", 2, kind="charge")
    m.inc("breaker_opened", 3, kind="charge")
    m.set_gauge("breaker_state", 0, kind="scheduler")
    m.set_gauge("paused", 0)
    m.set_gauge("rate_budget", 2.5, kind="charge")
    return m


def worker_rows(html: str, scheduler: str) -> dict[str, str]:
    """The worker rows of ``scheduler``'s section on the schedulers page, by worker label."""
    section = re.search(rf'<section class="scheduler" id="sched-{scheduler}">(.*?)</section>', html, re.S)
    assert section, html[:500]
    rows = re.findall(r'<tr class="worker[^"]*" data-worker="([^"]+)">(.*?)</tr>', section.group(1), re.S)
    return dict(rows)


# --- no broker ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "says"), [
    ("https://127.0.0.1:9464", "speaks plain http"),
    ("ftp://127.0.0.1:9464", "not a status URL"),
    ("http://127.0.0.1", "needs a port"),
    ("http://127.0.0.1:0", "needs a port"),
    ("http://127.0.0.1:70000", "needs a port"),
    ("http://:9464", "not a status URL"),
    ("not a url", "not a status URL"),
    (f"https://alice:{SECRET}@127.0.0.1:9464", "speaks plain http"),
])
def test_a_bad_worker_url_is_a_one_line_config_error(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match="--worker") as err:
        ConsoleConfig(bootstrap=UNREACHABLE, schedulers=[], workers=[url])
    text = str(err.value)
    assert says in text and "\n" not in text and SECRET not in text and "alice" not in text


def test_worker_urls_lose_credentials_and_repeats() -> None:
    config = ConsoleConfig(bootstrap=UNREACHABLE, schedulers=[],
                           workers=[f"http://alice:{SECRET}@127.0.0.1:9464/w1?t=x", "127.0.0.1:9465",
                                    "http://127.0.0.1:9465/"])
    assert config.targets == (Worker("http://127.0.0.1:9464/w1/status", "127.0.0.1:9464"),
                              Worker("http://127.0.0.1:9465/status", "127.0.0.1:9465"))


def test_the_cli_refuses_a_bad_worker_with_exit_2(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", UNREACHABLE)
    assert main(["console", "--worker", "http://127.0.0.1:9464", "--worker",
                 f"https://alice:{SECRET}@127.0.0.1:9464"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--worker https://127.0.0.1:9464: the status server speaks plain http" in err
    assert SECRET not in err


async def test_without_workers_the_page_says_how_to_add_them() -> None:
    client: TestClient[Any, Any] = TestClient(TestServer(
        build_app(ConsoleConfig(bootstrap=UNREACHABLE, schedulers=[])), host="127.0.0.1"))
    await client.start_server()
    try:
        html = await (await client.get("/schedulers")).text()
    finally:
        await client.close()
    assert 'id="workers-hint"' in html and "<code>--worker URL</code>" in html


@contextlib.asynccontextmanager
async def barrier_servers(n: int) -> AsyncIterator[list[int]]:
    """``n`` status servers that answer only once all ``n`` hold a request: asked one after
    the other, the first would wait for the others for ever (and time out); asked at once,
    every one answers. No clock is read."""
    waiting: list[asyncio.StreamWriter] = []
    everyone = asyncio.Event()
    body = b'{"schedulers": [], "pid": 1, "uptime_s": 1.0, "ready": true}'

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        waiting.append(writer)
        if len(waiting) == n:
            everyone.set()
        await everyone.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    servers = [await asyncio.start_server(answer, "127.0.0.1", 0) for _ in range(n)]
    try:
        yield [s.sockets[0].getsockname()[1] for s in servers]
    finally:
        for s in servers:
            s.close()
        for w in waiting:
            w.close()


async def test_workers_are_asked_at_once() -> None:
    async with barrier_servers(3) as ports:
        workers = [Worker(f"http://127.0.0.1:{p}/status", f"127.0.0.1:{p}") for p in ports]
        reports = await fetch_reports(workers)
    assert [(r.doc is not None, r.reason) for r in reports] == [(True, "")] * 3, reports


async def test_a_worker_that_never_answers_is_a_timed_out_row() -> None:
    async with silent_server() as port:
        reports = await fetch_reports([Worker(f"http://127.0.0.1:{port}/status", f"127.0.0.1:{port}")])
    assert [(r.doc, r.reason) for r in reports] == [(None, "timed out")]
    rows = table_for("anything", reports).rows
    assert [(w.worker, w.reachable) for w in rows] == [(f"127.0.0.1:{port}", False)]


# --- real broker ----------------------------------------------------------------------------------

@pytest.mark.kafka
async def test_the_schedulers_page_shows_each_workers_breakers(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    topic = await make_topic("console-workers")
    sched = failing_scheduler(topic, unique("cworkers").replace("-", "_"), error="unused")
    other = worker_metrics("another_scheduler")
    async with (StatusServer([worker_metrics(sched.name), other], port=0, ready=lambda: True) as status,
                StatusServer([other], port=0) as elsewhere, silent_server() as silent):
        host_port = status.url.split("://", 1)[1].rstrip("/")
        workers = [f"http://alice:{SECRET}@{host_port}", UNREACHABLE, f"127.0.0.1:{silent}", elsewhere.url]
        config = ConsoleConfig(bootstrap, [sched], port=0, workers=workers)
        async with Console(config) as console, ClientSession() as http:
            resp = await http.get(console.url + "/schedulers")
            html = await resp.text()
    assert resp.status == 200
    rows = worker_rows(html, sched.name)
    assert list(rows) == [host_port, UNREACHABLE, f"127.0.0.1:{silent}"]  # not the one without it
    row = rows[host_port]
    assert '<td class="ready">yes</td>' in row and '<td class="paused">no</td>' in row
    assert ('<span class="breaker open" data-scope="charge" data-state="OPEN">charge <strong>OPEN</strong> '
            '(opened <span class="opened">3</span>)</span>') in row
    assert 'data-scope="scheduler" data-state="closed"' in row and "charge 2.5/s" in row
    for label, why in ((UNREACHABLE, "cannot connect"), (f"127.0.0.1:{silent}", "timed out")):
        assert "<strong>unreachable</strong>" in rows[label] and why in rows[label], label
    elsewhere_label = elsewhere.url.split("://", 1)[1].rstrip("/")
    assert f"1 worker(s) answered without this scheduler: {elsewhere_label}" in html
    assert 'id="workers-hint"' not in html
    assert SECRET not in html and "alice" not in html
