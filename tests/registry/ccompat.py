"""The registry's Confluent-compatible API as the tests use it (aiohttp), and the wire format's
frame: byte 0, the schema id (4 bytes, big-endian), the Avro body.

Imported as ``tests.registry.ccompat``. No helper assumes an id's value: ids are whatever the
registry answered.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import aiohttp

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
TIMEOUT = aiohttp.ClientTimeout(total=10)


async def _call(method: str, url: str, body: dict[str, Any] | None = None,
                timeout: aiohttp.ClientTimeout = TIMEOUT) -> Any:
    async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
            method, url, data=None if body is None else json.dumps(body),
            headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE}) as resp:
        text = await resp.text()
        assert resp.status == 200, f"{method} {url}: HTTP {resp.status} {text[:500]}"
        return json.loads(text)


async def register(url: str, subject: str, schema: str) -> int:
    """Register ``schema`` (Avro schema text) under ``subject``; the id the registry gives it."""
    answer = await _call("POST", f"{url}/subjects/{subject}/versions", {"schema": schema})
    return int(answer["id"])


async def schema_by_id(url: str, schema_id: int, *,
                       timeout: aiohttp.ClientTimeout = TIMEOUT) -> dict[str, Any]:
    """The schema the registry stores under ``schema_id``, parsed (a dict)."""
    answer = await _call("GET", f"{url}/schemas/ids/{schema_id}", timeout=timeout)
    parsed: dict[str, Any] = json.loads(answer["schema"])
    return parsed


async def subjects_of(url: str, schema_id: int) -> list[str]:
    """The subjects under which ``schema_id`` is registered."""
    return sorted(v["subject"] for v in await _call("GET", f"{url}/schemas/ids/{schema_id}/versions"))


async def subject_ids(url: str, subject: str) -> list[int]:
    """The schema id of every version of ``subject``, oldest first."""
    versions = await _call("GET", f"{url}/subjects/{subject}/versions")
    return [int((await _call("GET", f"{url}/subjects/{subject}/versions/{v}"))["id"]) for v in versions]


def frame(schema_id: int, body: bytes) -> bytes:
    """A record value in the wire format."""
    return b"\x00" + struct.pack(">I", schema_id) + body


def unframe(value: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of a record value, asserting the magic byte."""
    assert len(value) >= 5 and value[0] == 0, f"not the registry wire format: {value[:8].hex()}"
    return struct.unpack(">I", value[1:5])[0], value[5:]
