"""The pytest plugin shipped with streamsched, proven the way a user meets it: with pytester.

An example user project (its own ``orders`` package in a temporary directory, not importable
from this repository or site-packages) writes a crash-recovery test in a few lines with the
plugin's fixtures; it runs in a separate pytest process against the shared broker.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import threading
from pathlib import Path

import pytest

from streamsched.testing import child_pythonpath, kit

pytest_plugins = ("pytester",)


def plugin_args() -> list[str]:
    """``-p streamsched.testing.plugin`` until the pytest11 entry point is installed (loading it
    twice would be an error)."""
    installed = any(ep.value == "streamsched.testing.plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "streamsched.testing.plugin"]


ORDERS_APP = '''
"""The example user's app: ship each due order once (a Kafka-native command)."""
import os

from streamsched import App, CommandContext, Emit, Selection, Turn, kafka_command

TOPIC = os.environ.get("ORDERS_TOPIC", "orders.transitions")
SHIPPED = os.environ.get("ORDERS_SHIPPED", "orders.shipped")
app = App("orders")


@kafka_command(outputs=[SHIPPED])
def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
    return [Emit.json(SHIPPED, {"order": order, "key": ctx.idempotency_key})]


@app.scheduler(name=os.environ.get("ORDERS_SCHEDULER", "ship_orders"), topic=TOPIC,
               selection=Selection("due", type="due"), commands=[ship], claim_duration_s=5)
async def ship_orders(turn: Turn) -> None:
    await turn.commands.ship(order=turn.event.target[0])
'''

ORDERS_CONFTEST = '''
from dataclasses import dataclass

import pytest


@dataclass
class Orders:
    topic: str
    shipped: str
    scheduler: str


@pytest.fixture
def orders(streamsched_topic, streamsched_group):
    return Orders(streamsched_topic("orders", partitions=2), streamsched_topic("shipped", kind="output"),
                  streamsched_group("ship"))


@pytest.fixture
def streamsched_env(orders):
    return {"ORDERS_TOPIC": orders.topic, "ORDERS_SHIPPED": orders.shipped,
            "ORDERS_SCHEDULER": orders.scheduler}
'''

ORDERS_TEST = '''
import signal

from streamsched.testing import make_event


def test_every_order_ships_once_after_a_crash(orders, crash_at, streamsched_worker, streamsched_produce,
                                              streamsched_reader):
    events = [make_event("due", "acme", [f"order-{i}"]) for i in range(8)]
    again = [make_event("due", "acme", [f"order-{i}"]) for i in range(8)]  # redelivered duplicates
    streamsched_produce(orders.topic, events + again)

    crash_at("after_claim").wait_killed(timeout=90)
    assert streamsched_reader.records(orders.shipped) == []  # it died before shipping anything

    streamsched_worker()
    streamsched_reader.wait_drained(orders.scheduler, orders.topic)
    shipped = streamsched_reader.json(orders.shipped)
    assert sorted(d["order"] for d in shipped) == sorted(f"order-{i}" for i in range(8))
    assert len({d["key"] for d in shipped}) == 8


def test_the_app_comes_from_this_project(streamsched_app):
    import orders.app

    assert streamsched_app == "orders.app:app" and orders.app.app.name == "orders"
'''


def write_project(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nstreamsched_app = orders.app:app\npythonpath = .\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    pkg = pytester.mkpydir("orders")
    (pkg / "app.py").write_text(ORDERS_APP)
    pytester.makeconftest(ORDERS_CONFTEST)
    pytester.makepyfile(test_recovery=ORDERS_TEST)


def test_a_user_project_recovery_test_passes_with_the_plugin(pytester: pytest.Pytester, bootstrap: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write_project(pytester)
    monkeypatch.setenv("STREAMSCHED_TEST_BOOTSTRAP", bootstrap)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-v", timeout=300)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_every_order_ships_once_after_a_crash PASSED*"])


def test_testcontainers_without_docker_skips_with_the_reason(pytester: pytest.Pytester, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_needs_kafka="def test_it(streamsched_bootstrap):\n    assert False\n")
    monkeypatch.delenv("STREAMSCHED_TEST_BOOTSTRAP", raising=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-docker.sock'}")
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", "-rs",
                                           "--streamsched-broker=testcontainers", timeout=120)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--streamsched-broker=testcontainers: no Docker engine reachable*"
                                 "no-docker.sock does not exist*"])


def test_docker_probe_accepts_an_engine_that_answers_ping(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        assert kit.docker_unavailable() is None
    finally:
        thread.join(5)
        server.close()


def test_crash_at_refuses_an_unknown_failpoint() -> None:
    assert kit.failpoint_env("after_claim", 2) == {"STREAMSCHED_FAILPOINT": "after_claim:2"}
    with pytest.raises(ValueError, match="unknown failpoint 'after_clam'"):
        kit.failpoint_env("after_clam")
    with pytest.raises(ValueError):
        kit.failpoint_env("after_claim", 0)


def test_worker_imports_the_app_from_the_users_project_first(tmp_path: Path) -> None:
    path = child_pythonpath([tmp_path], inherited=os.pathsep.join(["/x", str(tmp_path)])).split(os.pathsep)
    assert path[0] == str(tmp_path.resolve()) and path[1] == "/x"
    assert path.count(str(tmp_path.resolve())) == 1
