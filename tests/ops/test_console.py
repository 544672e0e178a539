"""``streamsched console``: routing, the CSRF and token guards and the one-line errors (aiohttp's
test client, no broker); on a real broker after real traffic through a worker, the pages show
the committed offsets, lag and dead-letter counts, actions are refused without a token and work
with one (a scheduler paused and resumed under the token's label), and no page ever holds an
event's tenant, target or payload; the same through a real
headless Chromium (selenium), which also takes the screenshot in docs/console.png."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError
from streamsched.kafka.admin import apply
from streamsched.ops.cli import main
from streamsched.ops.console import Console, ConsoleConfig, load_tokens
from streamsched.ops.console.app import build_app
from streamsched.ops.console.charts import bar_chart, line_chart
from streamsched.ops.console.sampler import Sample, Sampler
from streamsched.ops.console.security import CSRF_COOKIE, principal
from streamsched.ops.console.state import STATE
from streamsched.ops.inspect import identity_of
from streamsched.ops.pause import pause_history, pause_state
from streamsched.schedules.catalog import Catalog
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from streamsched.worker.app import SchedulerDef
from tests.components import require_module, require_program
from tests.conftest import TopicFactory, failing_scheduler

ROOT = Path(__file__).resolve().parents[2]
HANDLER_ERROR = "no such account: MARKER-ERROR"
TOKEN = "s3cret-console-token-0123456789"
UNREACHABLE = "127.0.0.1:1"
PAGES = ("/", "/schedulers", "/schedules", "/dlq", "/identity")




@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., Any]]:
    clients: list[TestClient[Any, Any]] = []

    async def make(**config: Any) -> TestClient[Any, Any]:
        cfg = ConsoleConfig(**{"bootstrap": UNREACHABLE, "schedulers": [], **config})
        client: TestClient[Any, Any] = TestClient(TestServer(build_app(cfg), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


async def csrf_of(client: TestClient[Any, Any], path: str = "/") -> str:
    resp = await client.get(path)
    assert resp.status == 200
    cookie = client.session.cookie_jar.filter_cookies(client.make_url("/"))[CSRF_COOKIE]
    return cookie.value


# --- no broker ------------------------------------------------------------------------------------

async def test_pages_are_read_only_by_default(client_for: Callable[..., Any]) -> None:
    client = await client_for()
    for path in PAGES:
        resp = await client.get(path)
        body = await resp.text()
        assert resp.status == 200, path
        assert "/actions/" not in body and "read-only" in body  # no buttons
        assert "script-src" not in resp.headers["Content-Security-Policy"]
        assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Frame-Options"] == "DENY" and resp.headers["Cache-Control"] == "no-store"
    csrf = await csrf_of(client)
    for action in ("redrive", "schedule", "dlq-replay"):
        resp = await client.post(f"/actions/{action}", data={"csrf": csrf, "token": TOKEN},
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 403 and "--allow-actions" in await resp.text()
    assert (await client.get("/nowhere")).status == 404


async def test_the_csrf_cookie_is_strict_and_http_only(client_for: Callable[..., Any]) -> None:
    client = await client_for()
    resp = await client.get("/")
    [cookie] = [c for c in resp.headers.getall("Set-Cookie") if c.startswith(CSRF_COOKIE)]
    assert "SameSite=Strict" in cookie and "HttpOnly" in cookie and "Path=/" in cookie


async def test_actions_need_the_csrf_token_and_a_valid_token(client_for: Callable[..., Any],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    tokens = load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": TOKEN})
    client = await client_for(allow_actions=True, tokens=tokens)
    body = await (await client.get("/schedules")).text()
    assert "actions on" in body
    csrf = await csrf_of(client)
    form = {"scheduler": "nope", "identity": "sched_" + "0" * 64}
    caplog.set_level(logging.INFO, "streamsched.console")
    refused = [({**form, "token": TOKEN}, "CSRF"),  # no CSRF field
               ({**form, "token": TOKEN, "csrf": "forged"}, "CSRF"),
               ({**form, "csrf": csrf}, "token"),  # no token
               ({**form, "csrf": csrf, "token": "wrong-token-wrong-token"}, "token")]
    for data, why in refused:
        resp = await client.post("/actions/redrive", data=data)
        assert resp.status == 403 and why in await resp.text(), data
    # Past both guards (the form token, or a bearer header): the unknown scheduler is one line.
    for headers, data in (({}, {**form, "csrf": csrf, "token": TOKEN}),
                          ({"Authorization": f"Bearer {TOKEN}"}, {**form, "csrf": csrf})):
        resp = await client.post("/actions/redrive", data=data, headers=headers)
        text = await resp.text()
        assert resp.status == 400 and "no scheduler nope in the console&#39;s apps" in text
        assert "Traceback" not in text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "refused: no valid token" in logged and "refused: no matching CSRF token" in logged
    assert TOKEN not in logged


async def test_a_foreign_host_name_is_not_answered(client_for: Callable[..., Any]) -> None:
    client = await client_for()
    assert (await client.get("/", headers={"Host": "evil.example:9480"})).status == 421
    assert (await client.get("/", headers={"Host": "localhost:9480"})).status == 200


async def test_errors_are_one_safe_line(client_for: Callable[..., Any]) -> None:
    sched = failing_scheduler("console-unused", "console_unused", error=HANDLER_ERROR)
    client = await client_for(schedulers=[sched])
    resp = await client.get("/identity", params={"scheduler": sched.name, "identity": "sched_<b>x</b>"})
    text = await resp.text()
    assert resp.status == 400 and "sched_ and 64 lower-case hex" in text
    assert "<b>x" not in text and "Traceback" not in text
    resp = await client.get("/identity", params={"scheduler": "other", "identity": "sched_" + "a" * 64})
    assert resp.status == 400 and "no scheduler other" in await resp.text()
    assert (await client.get("/schedules/unknown/x")).status == 404


async def test_the_pause_action_refuses_bad_input_before_reading_kafka(
        client_for: Callable[..., Any]) -> None:
    # The bootstrap is unreachable: each answer below comes before any Kafka call (else 503).
    sched = failing_scheduler("console-unused", "console_unused", error=HANDLER_ERROR)
    off = await client_for(schedulers=[sched])
    data = {"csrf": await csrf_of(off), "token": TOKEN, "scheduler": sched.name, "op": "pause",
            "reason": "maintenance"}
    resp = await off.post("/actions/pause", data=data, headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status == 403 and "--allow-actions" in await resp.text()
    client = await client_for(schedulers=[sched], allow_actions=True,
                              tokens=load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": TOKEN}))
    form = {"csrf": await csrf_of(client), "token": TOKEN, "scheduler": sched.name, "op": "pause"}
    for data, why in (({**form, "reason": "r", "scheduler": "nope"}, "no scheduler nope in the console"),
                      ({**form, "reason": "  "}, "a pause needs a reason"),
                      ({**form}, "a pause needs a reason"),
                      ({**form, "reason": "r" * 201}, "form field reason is longer than 200 characters"),
                      ({**form, "reason": "r", "op": "stop"}, "op must be pause or resume")):
        resp = await client.post("/actions/pause", data=data)
        text = await resp.text()
        assert resp.status == 400 and why in text, data
        assert "Traceback" not in text


def test_tokens_and_config() -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        ConsoleConfig(bootstrap=UNREACHABLE, schedulers=[], allow_actions=True)
    with pytest.raises(ConfigError, match="at least 16"):
        load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": "short"})
    tokens = load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": TOKEN})
    assert principal(tokens, TOKEN) == "console" and principal(tokens, TOKEN + "x") is None
    assert TOKEN not in repr(tokens)


def test_token_file_labels(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# operators\nalice aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbbbb\n")
    tokens = load_tokens(str(f), {})
    assert principal(tokens, "a" * 20) == "alice" and principal(tokens, "b" * 22) == "console"
    f.write_text("a b c\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_tokens(str(f), {})


def test_charts_escape_names_and_say_when_empty() -> None:
    svg = str(line_chart("lag", {"<x>": [(0.0, 1.0), (60.0, 3.0)]}))
    assert svg.startswith("<svg") and "&lt;x&gt;" in svg and "<x>" not in svg and "polyline" in svg
    assert "no samples yet" in str(line_chart("lag", {"a": []}))
    bars = str(bar_chart("per minute", [(0, 5, 1), (60, 2, 0)]))
    assert bars.count("<rect") == 1 + 4 and "5 executions" in bars


def test_per_minute_counts_are_sample_differences_and_the_ring_is_bounded() -> None:
    sampler = Sampler(UNREACHABLE, [], {}, keep=5)
    # minute 0: committed 10 -> 14, dead 0 -> 1; minute 1: 14 -> 20, dead 1; minute 2: a replay
    # moved the offsets back (counts 0, never negative).
    for at, done, dead in ((0, 10, 0), (30, 14, 1), (70, 20, 1), (130, 5, 1), (150, 6, 3)):
        sampler.ring.append(Sample(float(at), {"s": 0}, {"s": done}, {"s": dead}))
    assert sampler.per_minute("s", now=150) == [(0, 4, 1), (60, 6, 0), (120, 0, 2)]
    sampler.ring.append(Sample(200.0, {"s": 0}, {"s": 7}, {"s": 3}))
    assert len(sampler.ring) == 5 and sampler.ring[0].at == 30.0


def test_cli_refuses_actions_without_a_token(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMSCHED_CONSOLE_TOKEN", raising=False)
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", UNREACHABLE)
    assert main(["console", "--allow-actions"]) == 2
    assert "--allow-actions needs a token" in capsys.readouterr().err


# --- real broker ----------------------------------------------------------------------------------

MARKERS = ("MARKER-TENANT", "MARKER-TARGET", "MARKER-PAYLOAD", "MARKER-ERROR", "MARKER-SCHEDULE-PAYLOAD")


class Scene:
    """Real traffic: 6 good events and 1 that fails terminally (dead-lettered), each carrying
    marker strings in tenant, target and payload; a catalog with one schedule."""

    def __init__(self, sched: SchedulerDef, catalog: str, schedule: str, failed_identity: str,
                 good: int) -> None:
        self.sched, self.catalog, self.schedule = sched, catalog, schedule
        self.failed_identity, self.good = failed_identity, good

    @property
    def total(self) -> int:
        return self.good + 1


async def make_scene(bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str], *,
                     before_traffic: Callable[[SchedulerDef, str], Any] | None = None,
                     before_worker: Callable[[], Any] | None = None) -> Scene:
    """The scene; ``before_traffic(scheduler, catalog name)`` may start a console first, and
    ``before_worker()`` wait until its sampler saw the lag (then the chart shows it)."""
    topic = await make_topic("console", partitions=2)
    sched = failing_scheduler(topic, unique("console").replace("-", "_"), error=HANDLER_ERROR)
    catalog_name = unique("cc")
    if before_traffic is not None:
        await before_traffic(sched, catalog_name)
    good = [make_event("due", "MARKER-TENANT", [f"MARKER-TARGET-{i}"], payload={"p": "MARKER-PAYLOAD"})
            for i in range(6)]
    bad = make_event("due", "MARKER-TENANT", ["bad-MARKER-TARGET"], payload={"p": "MARKER-PAYLOAD"})
    await produce_events(bootstrap, topic, [*good, bad])
    if before_worker is not None:
        await before_worker()
    async with running_worker(sched, bootstrap):
        await wait_drained(bootstrap, sched.group, topic, timeout=90)
    catalog = Catalog(bootstrap, catalog_name, partitions=1, allow_single_replica=True)
    await catalog.ensure_topics()
    await catalog.schedule("nightly", "@every 1h", topic, {"p": "MARKER-SCHEDULE-PAYLOAD"},
                           tenant="MARKER-TENANT")
    return Scene(sched, catalog.name, "nightly", identity_of(sched, bad), len(good))


def assert_no_markers(pages: dict[str, str]) -> None:
    for path, html in pages.items():
        for marker in MARKERS:
            assert marker not in html, f"{marker} on {path}"


@pytest.mark.kafka
async def test_pages_show_real_counts_and_actions_need_a_token(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    scene = await make_scene(bootstrap, make_topic, unique)
    config = ConsoleConfig(bootstrap, [scene.sched], [scene.catalog], allow_actions=True,
                           tokens=load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": TOKEN}), port=0,
                           sample_interval_s=0.5)
    caplog.set_level(logging.INFO, "streamsched.console")
    # unsafe=True: the jar keeps cookies of an IP address (the console's 127.0.0.1).
    async with Console(config) as console, ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
        async def sampled() -> bool:
            html = await (await http.get(console.url + "/")).text()
            return f'<td class="n committed">{scene.total}</td>' in html

        await wait_for(sampled, timeout=30, what="the sampler's first sample")
        pages = {p: await (await http.get(console.url + p)).text() for p in PAGES}
        assert "<svg" in pages["/"] and "What is counted" in pages["/"]
        assert '<strong class="lag">0</strong>' in pages["/schedulers"]
        committed = [int(x) for x in re.findall(r'<td class="n committed">(\d+)</td>', pages["/schedulers"])]
        assert sum(committed) == scene.total and len(committed) == 2
        assert '<th class="n total">1</th>' in pages["/dlq"] and 'data-kind="terminal"' in pages["/dlq"]
        assert f"identity={scene.failed_identity}" in pages["/dlq"]
        assert 'data-schedule="nightly"' in pages["/schedules"]
        url = f"{console.url}/identity?scheduler={scene.sched.name}&identity={scene.failed_identity}"
        pages["identity"] = await (await http.get(url)).text()
        assert '<td id="outcome">FAILED</td>' in pages["identity"]
        pages["history"] = await (await http.get(f"{console.url}/schedules/{scene.catalog}/nightly")).text()
        # Pause the schedule (a request its ticker applies), then disable it: each refused without
        # the token, done with it.
        csrf = http.cookie_jar.filter_cookies(URL(console.url))[CSRF_COOKIE].value
        assert 'name="op" value="pause"' in pages["/schedules"]
        paused = {"csrf": csrf, "catalog": scene.catalog, "name": "nightly", "op": "pause", "reason": "audit"}
        assert (await http.post(console.url + "/actions/schedule", data=paused)).status == 403
        done = await http.post(console.url + "/actions/schedule", data={**paused, "token": TOKEN})
        assert done.status == 200 and "schedule nightly: pause requested (request " in await done.text()
        form = {"csrf": csrf, "catalog": scene.catalog, "name": "nightly", "op": "disable"}
        assert (await http.post(console.url + "/actions/schedule", data=form)).status == 403
        done = await http.post(console.url + "/actions/schedule", data={**form, "token": TOKEN})
        assert done.status == 200 and "schedule nightly: disabled" in await done.text()
        listing = await (await http.get(console.url + "/schedules")).text()
        assert '<td class="status">DISABLED</td>' in listing
        replay = await http.post(console.url + "/actions/dlq-replay",
                                 data={"csrf": csrf, "token": TOKEN, "scheduler": scene.sched.name,
                                       "dry_run": "on"})
        assert replay.status == 200 and "would replay 1" in await replay.text()
        assert_no_markers(pages | {"listing": listing})
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "name=nightly by console: disabled" in logged and TOKEN not in logged
    assert "schedule pause catalog=" in logged


def _pause_of(html: str, scheduler: str) -> tuple[str, str]:
    """The pause line of ``scheduler``'s section on the schedulers page: its data-paused value
    and the whole section (its form included)."""
    section = re.search(rf'<section class="scheduler" id="sched-{scheduler}">(.*?)</section>', html, re.S)
    assert section, html[:500]
    state = re.search(r'<p class="pause" data-paused="([a-z-]+)"', section.group(1))
    assert state, section.group(1)
    return state.group(1), section.group(1)


@pytest.mark.kafka
async def test_a_scheduler_is_paused_and_resumed_under_the_tokens_label(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    topic = await make_topic("console-pause", partitions=2)
    sched = failing_scheduler(topic, unique("cpause").replace("-", "_"), error=HANDLER_ERROR)
    await apply(bootstrap, sched.internal_topics(2, 1))
    bare = failing_scheduler(topic, unique("cbare").replace("-", "_"), error=HANDLER_ERROR)  # no topics
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice {TOKEN}\n")
    config = ConsoleConfig(bootstrap, [sched, bare], allow_actions=True,
                           tokens=load_tokens(str(token_file), {}), port=0)
    caplog.set_level(logging.INFO, "streamsched.console")
    async with Console(config) as console, ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
        async def page() -> str:
            resp = await http.get(console.url + "/schedulers")
            assert resp.status == 200
            return await resp.text()

        html = await page()
        state, section = _pause_of(html, sched.name)
        assert state == "no" and "<strong>running</strong>" in section
        assert 'action="/actions/pause"' in section and 'name="op" value="pause"' in section
        state, section = _pause_of(html, bare.name)
        assert state == "no-control-topic" and "no control topic" in section
        assert "/actions/pause" not in section and 'class="error"' not in section
        csrf = http.cookie_jar.filter_cookies(URL(console.url))[CSRF_COOKIE].value
        form = {"csrf": csrf, "scheduler": sched.name, "op": "pause", "reason": "maintenance window"}
        # Refused, and nothing written: no token, a wrong one, a forged or missing CSRF token.
        for data, headers in ((form, {}), ({**form, "token": "wrong-token-wrong-token"}, {}),
                              ({**form, "token": TOKEN, "csrf": "forged"}, {}),
                              ({k: v for k, v in form.items() if k != "csrf"},
                               {"Authorization": f"Bearer {TOKEN}"})):
            resp = await http.post(console.url + "/actions/pause", data=data, headers=headers)
            assert resp.status == 403, data
        assert await pause_history(bootstrap, sched.name) == []

        done = await http.post(console.url + "/actions/pause", data={**form, "token": TOKEN})
        text = await done.text()
        assert done.status == 200 and "pause requested" in text
        assert '<strong id="principal">alice</strong>' in text
        paused = await pause_state(bootstrap, sched.name)
        assert paused.paused and paused.last is not None
        assert (paused.last.principal, paused.last.reason) == ("alice", "maintenance window")
        state, section = _pause_of(await page(), sched.name)
        assert state == "yes" and '<span class="principal">alice</span>' in section
        assert "maintenance window" in section and 'name="op" value="resume"' in section

        # Resume, this time with the bearer header; a reason is optional.
        done = await http.post(console.url + "/actions/pause",
                               data={"csrf": csrf, "scheduler": sched.name, "op": "resume"},
                               headers={"Authorization": f"Bearer {TOKEN}"})
        assert done.status == 200 and "resume requested" in await done.text()
        resumed = await pause_state(bootstrap, sched.name)
        assert not resumed.paused and resumed.last is not None and resumed.last.principal == "alice"
        assert [r.paused for r in await pause_history(bootstrap, sched.name)] == [True, False]
        state, section = _pause_of(await page(), sched.name)
        assert state == "no" and "resumed by" in section and 'name="op" value="pause"' in section

        # A scheduler without a control topic, or not the console's: one line, nothing written.
        for name, why in ((bare.name, "control topic"), ("nope", "no scheduler nope in the console")):
            resp = await http.post(console.url + "/actions/pause", data={**form, "token": TOKEN,
                                                                           "scheduler": name})
            assert resp.status == 400 and why in await resp.text(), name
        assert len(await pause_history(bootstrap, sched.name)) == 2
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"console action pause scheduler={sched.name} request=" in logged
    assert f"console action resume scheduler={sched.name} request=" in logged and "by alice" in logged
    assert "action pause refused: no valid token" in logged
    assert "action pause refused: no matching CSRF token" in logged
    assert TOKEN not in logged


@pytest.mark.kafka
def test_console_cli_serves_and_stops_on_sigterm(bootstrap: str) -> None:
    env = {**os.environ, "STREAMSCHED_BOOTSTRAP": bootstrap, "PYTHONPATH": str(ROOT)}
    env.pop("STREAMSCHED_CONSOLE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "streamsched", "console", "--app",
                             "tests.ops.test_console:APP", "--port", "0"],
                            env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = re.search(r'"console_url": "([^"]+)"', line)
        assert url, line
        import urllib.request

        with urllib.request.urlopen(url.group(1) + "/schedulers", timeout=30) as resp:
            body = resp.read().decode()
        assert "console_cli_" in body and "read-only" in body  # the app as the subprocess loaded it
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


APP = App("console_cli")
APP_SCHEDULER = f"console_cli_{uuid.uuid4().hex[:8]}"


@external_command()
async def _noop(ctx: CommandContext) -> None:
    return None


@APP.scheduler(name=APP_SCHEDULER, topic=f"console-cli-{APP_SCHEDULER[-8:]}",
               selection=Selection("due", type="due"), commands=[_noop])
async def _handle(turn: Turn) -> None:
    await turn.commands._noop()


# --- a real browser -------------------------------------------------------------------------------

def _browser() -> Any:
    """Headless Chromium through chromedriver (Debian's packages: `make chromium`)."""
    require_module("selenium", "selenium is not installed (pip install selenium)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or require_program(
        "chromium-browser", "neither chromium nor chromium-browser on PATH (`make chromium` installs it)")
    driver = require_program("chromedriver", "`make chromium` installs it where apt is")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1180",
                "--disable-gpu"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def _browse(url: str, scene: Scene, shot: Path) -> dict[str, str]:
    """Every page through the browser; the re-drive form refused with a wrong token, done with
    the right one; the overview's screenshot into ``shot``. Returns each page's source."""
    import time

    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    browser = _browser()
    pages: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 30
        while True:  # the overview fills in once the sampler has a sample
            browser.get(url + "/")
            cells = browser.find_elements(By.CSS_SELECTOR, "#overview td.committed")
            if cells and cells[0].text == str(scene.total):
                break
            assert time.monotonic() < deadline, browser.page_source[:300]
            time.sleep(0.5)
        browser.save_screenshot(str(shot))
        pages["/"] = browser.page_source
        for path in PAGES[1:]:
            browser.get(url + path)
            pages[path] = browser.page_source
        browser.get(url + "/schedulers")
        committed = [int(c.text) for c in browser.find_elements(By.CSS_SELECTOR, "td.committed")]
        assert sum(committed) == scene.total
        assert browser.find_element(By.CSS_SELECTOR, ".lag").text == "0"
        browser.get(url + "/dlq")
        assert browser.find_element(By.CSS_SELECTOR, "th.total").text == "1"
        assert browser.find_element(By.CSS_SELECTOR, '[data-kind="terminal"] .count').text == "1"
        # The dead letter links to its identity's page (the digest, never what it is made of).
        browser.find_element(By.CSS_SELECTOR, "a.identity").click()
        WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(
            lambda b: b.find_element(By.ID, "outcome").text == "FAILED")
        assert scene.failed_identity in browser.current_url
        look = f"{url}/identity?scheduler={scene.sched.name}&identity={scene.failed_identity}"
        pages["identity"] = browser.page_source

        def redrive(token: str, expect: str) -> None:
            browser.get(look)
            form = browser.find_element(By.ID, "redrive")
            form.find_element(By.NAME, "token").send_keys(token)
            form.find_element(By.NAME, "reason").send_keys("console test")
            form.find_element(By.TAG_NAME, "button").click()
            # Until the answer page has loaded. Meanwhile the form's page goes stale, which
            # chromedriver reports as a stale element or, caught mid-navigation, as a node that
            # no longer "belongs to the document" (a plain WebDriverException): both mean "not yet".
            WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(
                lambda b: expect in b.find_element(By.TAG_NAME, "body").text)

        redrive("not-the-token-at-all", "a valid console token is needed")
        redrive(TOKEN, "re-drive requested")
        assert browser.find_element(By.ID, "principal").text == "console"
        pages["redrive"] = browser.page_source
        return pages
    finally:
        browser.quit()


@pytest.mark.kafka
async def test_a_real_browser_sees_real_counts_and_no_payload(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str], tmp_path: Path) -> None:
    _browser().quit()  # skips before any traffic when there is no browser
    shot = Path(os.environ.get("STREAMSCHED_CONSOLE_SCREENSHOT") or tmp_path / "console.png")
    async with contextlib.AsyncExitStack() as stack:
        consoles: list[Console] = []

        async def start(sched: SchedulerDef, catalog: str) -> None:
            config = ConsoleConfig(bootstrap, [sched], [catalog], allow_actions=True,
                                   tokens=load_tokens(None, {"STREAMSCHED_CONSOLE_TOKEN": TOKEN}), port=0,
                                   sample_interval_s=0.5)
            consoles.append(await stack.enter_async_context(Console(config)))

        async def lag_sampled() -> None:
            sampler = consoles[0].app[STATE].sampler

            async def seen() -> bool:  # a few samples with the whole backlog as lag
                return sum(1 for s in sampler.ring if sum(s.lag.values()) == 7) >= 4

            await wait_for(seen, timeout=30, what="the sampler to see the backlog")

        scene = await make_scene(bootstrap, make_topic, unique, before_traffic=start,
                                 before_worker=lag_sampled)
        # selenium blocks: it runs in a thread while this loop serves the console.
        pages = await asyncio.to_thread(_browse, consoles[0].url, scene, shot)
        # The re-drive went to the owner as a request: a worker applies it and audits it under
        # the token's label, which the identity page shows.
        async with running_worker(scene.sched, bootstrap):
            await wait_drained(bootstrap, scene.sched.group, scene.sched.topic, timeout=90)
        async with ClientSession() as http:
            look = f"{consoles[0].url}/identity?scheduler={scene.sched.name}&identity={scene.failed_identity}"
            pages["audited"] = await (await http.get(look)).text()
        assert '<td class="result">reopened</td>' in pages["audited"]
        assert "<td>console</td>" in pages["audited"] and "console test" in pages["audited"]
    assert shot.stat().st_size > 1000
    assert_no_markers(pages)
