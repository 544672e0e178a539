"""The registry client's reading of HTTP answers (a stub server speaking the Confluent API's
error shapes; the real registry is tests/registry), its settings and the schema cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from streamsched.errors import ConfigError, RegistryUnavailable
from streamsched.kafka.clients import Connection
from streamsched.kafka.registry import RegistryClient, SchemaCache
from streamsched.kafka.security import RegistrySettings
from streamsched.ops.config import resolve_connection
from streamsched.wire.registry import UNKNOWN_SCHEMA, transition_schema_text

PASSWORD = "registry-pass-93ab"


@pytest.fixture
async def stub() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A registry whose answer to ``/schemas/ids/{id}`` is set per id by the test."""
    answers: dict[str, Any] = {"calls": 0, "seen_auth": None}

    async def by_id(request: web.Request) -> web.Response:
        answers["calls"] += 1
        answers["seen_auth"] = request.headers.get("Authorization")
        status, body = answers.get(request.match_info["id"], (404, {"error_code": 40403}))
        if status == "hang":
            await asyncio.sleep(2)  # past the client's timeout
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/schemas/ids/{id}", by_id)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", answers
    finally:
        await runner.cleanup()


async def test_answers_are_sorted_into_schemas_unknown_ids_and_outages(
        stub: tuple[str, dict[str, Any]]) -> None:
    url, answers = stub
    answers.update({"1": (200, {"schema": transition_schema_text()}), "2": (500, {"error_code": 50001}),
                    "3": (401, {}), "4": ("hang", {})})
    settings = RegistrySettings(url, username="u", password=PASSWORD)
    async with RegistryClient(settings, timeout_s=0.5) as client:
        assert await client.schema(1) == transition_schema_text()
        assert answers["seen_auth"].startswith("Basic ")
        assert await client.schema(9) is None  # the registry does not know it: the record's fault
        for schema_id in (2, 3, 4):  # the registry's fault: waited out, never a dead letter
            with pytest.raises(RegistryUnavailable) as info:
                await client.schema(schema_id)
            assert PASSWORD not in str(info.value) and url not in str(info.value)


async def test_the_cache_asks_once_per_id_and_keeps_unknown_ids(stub: tuple[str, dict[str, Any]]) -> None:
    url, answers = stub
    answers["1"] = (200, {"schema": transition_schema_text()})
    async with RegistryClient(RegistrySettings(url)) as client:
        cache = SchemaCache(client, max_schemas=2)
        await asyncio.gather(cache.load([1, 7]), cache.load([1]))
        assert answers["calls"] == 2
        one, seven = cache.get(1), cache.get(7)
        assert one is not None and one.problem is None
        assert seven is not None and seven.problem == UNKNOWN_SCHEMA
        await cache.load([8])  # past the bound: the least recently used (1) goes
        assert cache.get(1) is None and cache.get(8) is not None


async def test_an_outage_caches_nothing() -> None:
    async with RegistryClient(RegistrySettings("http://127.0.0.1:9"), timeout_s=0.5) as client:
        cache = SchemaCache(client)
        with pytest.raises(RegistryUnavailable):
            await cache.load([1])
        assert cache.get(1) is None


def test_settings_are_checked_and_redacted(tmp_path: Any) -> None:
    for bad in ("ftp://h", "http://u:p@h:1", "nohost"):
        with pytest.raises(ConfigError):
            RegistrySettings(bad)
    with pytest.raises(ConfigError):
        RegistrySettings("http://h", username="u")
    with pytest.raises(ConfigError):
        RegistrySettings("http://h", username="u", password="p", token="t")
    token_file = tmp_path / "token"
    token_file.write_text(PASSWORD + "\n")
    conn = resolve_connection({"bootstrap": "k:9092"}, local_state=None,
                              env={"STREAMSCHED_REGISTRY_URL": "https://r:8081/",
                                   "STREAMSCHED_REGISTRY_TOKEN_FILE": str(token_file)})
    assert isinstance(conn, Connection) and conn.registry is not None
    assert conn.registry.url == "https://r:8081"
    assert conn.registry.headers()["Authorization"] == f"Bearer {PASSWORD}"
    assert PASSWORD not in repr(conn) and "token" in repr(conn)
    with pytest.raises(ConfigError):  # credentials without a URL are a mistake, not ignored
        resolve_connection({"bootstrap": "k:9092"}, local_state=None,
                           env={"STREAMSCHED_REGISTRY_USERNAME": "u"})
    conf = tmp_path / "conn.toml"
    conf.write_text(f'bootstrap = "k:9092"\n[registry]\nurl = "http://r:1"\nusername = "u"\n'
                    f'password = "{PASSWORD}"\n')
    from_file = resolve_connection({"config": str(conf)}, env={}, local_state=None)
    assert from_file.registry is not None and from_file.registry.username == "u"
    assert PASSWORD not in repr(from_file)
