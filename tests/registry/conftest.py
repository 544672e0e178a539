"""The session's schema registry: Apicurio Registry on loopback (streamsched.testing.registry),
fetched on first use when ``make registry`` has not run. Tests that also use Kafka are marked
``kafka`` (the ``bootstrap`` fixture marks them); the registry alone is not."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from streamsched.errors import RegistryError
from streamsched.testing.registry import RegistryRunner, find_java, registry_home
from tests import components


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryRunner]:
    """A running registry (``.url``: its Confluent-compatible API) for the whole session.

    A test that takes it down (``pause()``, ``with schema_registry.down():``) brings it back before
    it ends: the next test shares it. In-memory storage: nothing survives the session."""
    try:
        java = find_java()
    except RegistryError as exc:
        components.require("Java 21+", str(exc))
    if shutil.which("mvn") is None and not (registry_home() / "quarkus-run.jar").is_file():
        components.require("mvn", "needs mvn on PATH once to fetch Apicurio Registry (`make registry`)")
    runner = RegistryRunner(tmp_path_factory.mktemp("registry"), java=java)
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()
