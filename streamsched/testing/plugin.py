"""pytest plugin: test your own schedulers on a real Kafka, crashes included, in a few lines.

Installed with streamsched (entry point ``pytest11: streamsched``); before that, or to be
explicit, load it with ``-p streamsched.testing.plugin``. Fixtures (all synchronous: no asyncio
plugin needed):

``streamsched_bootstrap`` (session)
    ``STREAMSCHED_TEST_BOOTSTRAP`` if set (an existing cluster); else a local Apache Kafka started
    from the project's cached jars (:class:`streamsched.ops.broker.LocalCluster`, needs Java);
    else, with ``--streamsched-broker=testcontainers``, testcontainers' Kafka container (skipped
    with the reason where no Docker engine answers or testcontainers is not installed).
``streamsched_unique`` / ``streamsched_group``
    unique names (``prefix-<hex>``) for topics, scheduler names and consumer groups.
``streamsched_topic``
    ``streamsched_topic("orders", partitions=2, kind="transition")`` creates a unique topic.
``streamsched_app`` / ``streamsched_env``
    the ``MODULE:ATTR`` the worker fixtures run (ini ``streamsched_app``) and extra environment
    for every worker (``{}``); override either in your conftest.py.
``streamsched_worker``
    ``streamsched_worker(env=..., scheduler=...)`` starts ``streamsched run --app APP`` as a child
    process of your project (cwd: the rootdir; PYTHONPATH: ini ``streamsched_app_path``, the ini
    ``pythonpath``, then the rootdir) and stops it at teardown.
``crash_at``
    ``crash_at("after_claim").wait_killed()``: a worker that SIGKILLs itself at that failpoint
    (:mod:`streamsched.failpoints`; ``nth=`` picks the pass).
``streamsched_reader``
    read-committed reads of output topics: ``records``, ``json``, ``wait_for(topic, n)``,
    ``wait_drained(scheduler, topic)``.
``streamsched_produce``
    ``streamsched_produce(topic, events)`` through :class:`streamsched.Producer`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamsched.model.event import TransitionEvent
from streamsched.testing.kit import (
    Reader,
    TopicFactory,
    WorkerFactory,
    docker_unavailable,
    produce,
    unique_name,
)

DEFAULT_KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.1"
"""Confluent Platform 7.9 ships Apache Kafka 3.9, the older of the two lines streamsched tests
(3.9.1 and 4.4.0; see :data:`streamsched.kafka.version.TESTED_KAFKA_VERSIONS`)."""
_CONTAINER_ENV = {
    # A single broker: internal topics (transactions!) must not ask for 3 replicas.
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_MIN_INSYNC_REPLICAS": "1",
    "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamsched", "streamsched Kafka fixtures")
    group.addoption("--streamsched-broker", choices=("local", "testcontainers"), default=None,
                    help="Kafka for the streamsched fixtures when STREAMSCHED_TEST_BOOTSTRAP is unset: "
                         "local (Apache Kafka's jars on this machine's Java, the default) or "
                         "testcontainers (a Docker container)")
    parser.addini("streamsched_broker", "local or testcontainers (see --streamsched-broker)", default="local")
    parser.addini("streamsched_app", "MODULE:ATTR of the app the worker fixtures run", default="")
    parser.addini("streamsched_app_path", "directories the worker imports the app from (default: rootdir)",
                  type="paths", default=[])
    parser.addini("streamsched_kafka_image", "image of --streamsched-broker=testcontainers",
                  default=DEFAULT_KAFKA_IMAGE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "streamsched: a test using the streamsched Kafka fixtures")


def _broker_mode(config: pytest.Config) -> str:
    mode = config.getoption("streamsched_broker") or config.getini("streamsched_broker") or "local"
    if mode not in ("local", "testcontainers"):
        raise pytest.UsageError(f"streamsched_broker must be local or testcontainers, not {mode!r}")
    return str(mode)


@pytest.fixture(scope="session")
def streamsched_bootstrap(request: pytest.FixtureRequest,
                          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a real Kafka for this session (see the module docstring for which)."""
    external = os.environ.get("STREAMSCHED_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    if _broker_mode(request.config) == "testcontainers":
        yield from _container(request.config)
        return
    from streamsched.errors import BrokerError
    from streamsched.ops.broker import LocalCluster

    cluster = LocalCluster(data_dir=tmp_path_factory.mktemp("streamsched-kafka"))
    try:
        bootstrap = cluster.start()
    except BrokerError as exc:
        cluster.stop()
        pytest.fail(f"streamsched: the local Kafka broker did not start ({exc}); set "
                    "STREAMSCHED_TEST_BOOTSTRAP or use --streamsched-broker=testcontainers", pytrace=False)
    try:
        yield bootstrap
    finally:
        cluster.stop()


def _container(config: pytest.Config) -> Iterator[str]:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(f"--streamsched-broker=testcontainers: {reason}")
    try:
        module = importlib.import_module("testcontainers.kafka")
    except ImportError:
        pytest.skip("--streamsched-broker=testcontainers: testcontainers is not installed "
                    "(pip install 'streamsched[testcontainers]')")
    container = module.KafkaContainer(config.getini("streamsched_kafka_image")).with_kraft()
    for key, value in _CONTAINER_ENV.items():
        container.with_env(key, value)
    container.start()
    try:
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


@pytest.fixture
def streamsched_unique() -> Callable[[str], str]:
    """``unique("orders")`` -> ``"orders-3f9c0a1b2d"``: names no other test shares."""
    return unique_name


@pytest.fixture
def streamsched_group() -> Callable[..., str]:
    """A unique consumer-group id (or scheduler name: its group is ``streamsched.<name>``)."""

    def make(prefix: str = "group") -> str:
        return unique_name(prefix)

    return make


@pytest.fixture
def streamsched_topic(streamsched_bootstrap: str) -> TopicFactory:
    """Creates uniquely named topics: ``streamsched_topic("orders", partitions=2)``."""
    return TopicFactory(streamsched_bootstrap)


@pytest.fixture
def streamsched_app(request: pytest.FixtureRequest) -> str:
    """The ``MODULE:ATTR`` the worker fixtures run: ini ``streamsched_app``; override to choose."""
    return str(request.config.getini("streamsched_app"))


@pytest.fixture
def streamsched_env() -> dict[str, str]:
    """Extra environment for every worker of the test (override it, e.g. with unique topic names)."""
    return {}


def _app_path(config: pytest.Config) -> list[Path]:
    """Where the worker imports the user's app from: ini ``streamsched_app_path``, the ini
    ``pythonpath`` (pytest's own setting), then the rootdir."""
    paths: list[Path] = [Path(p) for p in config.getini("streamsched_app_path")]
    paths += [Path(p) for p in config.getini("pythonpath")]
    paths.append(Path(config.rootpath))
    return paths


@pytest.fixture
def streamsched_worker(streamsched_bootstrap: str, streamsched_app: str, streamsched_env: dict[str, str],
                       request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkerFactory]:
    """``streamsched_worker()`` starts a worker of the user's app (a WorkerProcess); teardown
    stops every worker it started (SIGTERM, then SIGKILL). The workers of one test share a claim
    store directory in its ``tmp_path`` (so a restart after ``crash_at`` restores warm, as in
    production), unless ``STREAMSCHED_STORE_DIR`` is set or ``streamsched_env`` names another."""
    logs = tmp_path / "streamsched-workers"
    logs.mkdir(exist_ok=True)
    # Unless the session chose one (e.g. STREAMSCHED_STORE_DIR=:memory: pytest) or the test does.
    store = os.environ.get("STREAMSCHED_STORE_DIR") or str(tmp_path / "streamsched-stores")
    env = {"STREAMSCHED_STORE_DIR": store, **streamsched_env}
    factory = WorkerFactory(streamsched_bootstrap, app=streamsched_app or None,
                            cwd=Path(request.config.rootpath), app_path=_app_path(request.config),
                            log_dir=logs, env=env)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def crash_at(streamsched_worker: WorkerFactory) -> Callable[..., Any]:
    """``crash_at("after_claim", nth=1)``: start a worker that SIGKILLs itself at that failpoint;
    ``.wait_killed()`` on the result waits for the crash (AssertionError with the log otherwise)."""

    def start(point: str, *, nth: int = 1, app: str | None = None, env: dict[str, str] | None = None,
              scheduler: str | None = None) -> Any:
        return streamsched_worker(app, env=env, scheduler=scheduler, failpoint=point, nth=nth)

    return start


@pytest.fixture
def streamsched_reader(streamsched_bootstrap: str) -> Reader:
    """Read-committed reads of output topics (what a downstream consumer sees)."""
    return Reader(streamsched_bootstrap)


@pytest.fixture
def streamsched_produce(streamsched_bootstrap: str) -> Callable[[str, Iterable[TransitionEvent]], int]:
    """``streamsched_produce(topic, events)``: validated, route-keyed, home-partitioned."""

    def send(topic: str, events: Iterable[TransitionEvent]) -> int:
        return produce(streamsched_bootstrap, topic, events)

    return send
