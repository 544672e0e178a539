"""The schema registry client: the few requests of the Confluent-compatible REST API we make.

Workers only read (a writer schema by id); ``streamsched schemas register|check`` and a
:class:`~streamsched.kafka.producer.Producer` in registry mode also look up, register and test
compatibility under a subject. Any registry speaking that API works (Confluent Schema Registry,
Apicurio Registry's ``/apis/ccompat/v7``, Karapace, Redpanda).

Written on aiohttp (already a dependency) rather than confluent-kafka's registry client, which
would add httpx, authlib, attrs and cachetools to every worker for five endpoints, and whose
errors do not separate what a worker must wait out (the registry unreachable, timing out,
refusing our credentials, failing with 5xx) from what is the record's fault (an id the registry
does not know): here the first is :class:`~streamsched.errors.RegistryUnavailable` and the
second an answer (None), which the reader turns into a dead letter with a schema reason.

:class:`SchemaCache` keeps the writer schemas a worker has resolved, bounded (least recently used
out first): a schema id names immutable content, so an entry never goes stale.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import quote

from streamsched.errors import ConfigError, RegistryUnavailable
from streamsched.kafka.security import REGISTRY_CONTENT_TYPE, RegistrySettings
from streamsched.wire.registry import WriterSchema, writer_schema

__all__ = ["COMPATIBILITY_LEVELS", "RegistryClient", "SchemaCache", "client_for"]

REQUEST_TIMEOUT_S: Final = 5.0
CACHE_SCHEMAS: Final = 1024
"""Writer schemas a worker keeps parsed (a topic rarely sees more than a few)."""
MAX_SCHEMA_BYTES: Final = 256 * 1024
"""The largest schema answer read: a registry answering more is refused, not buffered."""
COMPATIBILITY_LEVELS: Final = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
                               "FULL", "FULL_TRANSITIVE", "NONE")
# error_code values of the Confluent API for "no such subject / version / schema".
_NOT_FOUND_CODES: Final = frozenset({40401, 40402, 40403})


class RegistryClient:
    """One registry's REST API (an aiohttp session, opened on first use; :meth:`close` it)."""

    def __init__(self, settings: RegistrySettings, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._session: Any = None

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> Any:
        import aiohttp

        if self._session is None:
            s = self.settings
            context = ssl.create_default_context(cafile=s.cafile) if s.cafile else None
            self._session = aiohttp.ClientSession(
                headers=s.headers(), timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(ssl=context if context is not None else True, limit=8))
        return self._session

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer, None for a documented "not found", else RegistryUnavailable (with a
        reason that never holds the URL's query, a credential or a schema)."""
        import aiohttp

        session = self._open()
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": REGISTRY_CONTENT_TYPE} if data is not None else None
        try:
            async with session.request(method, self.settings.url + path, data=data, headers=headers) as resp:
                raw = await resp.content.read(MAX_SCHEMA_BYTES + 1)
                status = resp.status
        except TimeoutError:
            raise RegistryUnavailable(f"no answer within {self.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RegistryUnavailable(f"unreachable ({type(exc).__name__})") from None
        if len(raw) > MAX_SCHEMA_BYTES:
            raise RegistryUnavailable("answer larger than the schema bound")
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        code = doc.get("error_code") if isinstance(doc, dict) else None
        if status == 404 and (code in _NOT_FOUND_CODES or code is None):
            return None
        if status in (401, 403):
            raise RegistryUnavailable(f"HTTP {status}: the registry refused our credentials")
        if status >= 400:
            raise RegistryUnavailable(f"HTTP {status}" + (f" (error {code})" if code else ""))
        return doc

    async def schema(self, schema_id: int) -> str | None:
        """The schema text registered under ``schema_id`` (None: no such id)."""
        doc = await self._call("GET", f"/schemas/ids/{int(schema_id)}")
        if doc is None:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise RegistryUnavailable("malformed answer to a schema lookup")
        if doc.get("schemaType", "AVRO") != "AVRO":
            return "not avro"  # parsed as an invalid Avro schema: dead letters with a schema reason
        return str(doc["schema"])

    async def lookup(self, subject: str, schema: str) -> int | None:
        """The id of ``schema`` if it is registered under ``subject``."""
        doc = await self._call("POST", f"/subjects/{quote(subject, safe='')}", {"schema": schema})
        return _id(doc)

    async def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (its id, which it keeps if already registered)."""
        doc = await self._call("POST", f"/subjects/{quote(subject, safe='')}/versions", {"schema": schema})
        found = _id(doc)
        if found is None:
            raise RegistryUnavailable("the registry did not return the registered schema's id")
        return found

    async def set_compatibility(self, subject: str, level: str) -> None:
        if level not in COMPATIBILITY_LEVELS:
            raise ConfigError(f"compatibility must be one of {', '.join(COMPATIBILITY_LEVELS)}")
        await self._call("PUT", f"/config/{quote(subject, safe='')}", {"compatibility": level})

    async def latest(self, subject: str) -> tuple[int, int, str] | None:
        """(id, version, schema) of the subject's latest version (None: no such subject)."""
        doc = await self._call("GET", f"/subjects/{quote(subject, safe='')}/versions/latest")
        if doc is None:
            return None
        try:
            return int(doc["id"]), int(doc["version"]), str(doc["schema"])
        except (KeyError, TypeError, ValueError):
            raise RegistryUnavailable("malformed answer to a version lookup") from None

    async def compatible(self, subject: str, schema: str) -> bool | None:
        """Whether ``schema`` may be registered next under ``subject`` by its compatibility
        level (None: the subject has no version to test against)."""
        doc = await self._call("POST", f"/compatibility/subjects/{quote(subject, safe='')}/versions/latest",
                               {"schema": schema})
        if doc is None:
            return None
        return bool(doc.get("is_compatible")) if isinstance(doc, dict) else False


def _id(doc: Any) -> int | None:
    if not isinstance(doc, dict) or "id" not in doc:
        return None
    try:
        return int(doc["id"])
    except (TypeError, ValueError):
        return None


class SchemaCache:
    """Writer schemas by id, resolved through ``client`` and kept (bounded, least recently used
    out first). :meth:`load` is the only step that waits on the registry; :meth:`get` answers
    from memory, so the turn's decoding stays synchronous."""

    def __init__(self, client: RegistryClient, *, max_schemas: int = CACHE_SCHEMAS) -> None:
        self.client = client
        self.max_schemas = max_schemas
        self._known: OrderedDict[int, WriterSchema] = OrderedDict()
        self._loading: dict[int, asyncio.Future[WriterSchema]] = {}

    def get(self, schema_id: int) -> WriterSchema | None:
        hit = self._known.get(schema_id)
        if hit is not None:
            self._known.move_to_end(schema_id)
        return hit

    async def load(self, ids: Iterable[int]) -> None:
        """Resolve every id not known yet (raises RegistryUnavailable; nothing is cached then)."""
        for schema_id in dict.fromkeys(ids):
            if schema_id not in self._known:
                self._put(await self._fetch(schema_id))

    async def _fetch(self, schema_id: int) -> WriterSchema:
        # Partitions of one worker share the cache: one request per id, whoever asks first.
        pending = self._loading.get(schema_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[WriterSchema] = asyncio.get_running_loop().create_future()
        self._loading[schema_id] = future
        try:
            found = writer_schema(schema_id, await self.client.schema(schema_id))
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: a waiter that went away leaves no warning
            raise
        except BaseException:
            # The asking partition stopped: others waiting on its request wait and ask again.
            future.set_exception(RegistryUnavailable("the request was abandoned"))
            future.exception()
            raise
        finally:
            self._loading.pop(schema_id, None)
        future.set_result(found)
        return found

    def _put(self, schema: WriterSchema) -> None:
        self._known[schema.schema_id] = schema
        self._known.move_to_end(schema.schema_id)
        while len(self._known) > self.max_schemas:
            self._known.popitem(last=False)


def client_for(conn: Any) -> RegistryClient:
    """The registry client of a connection (a :class:`~streamsched.kafka.clients.Connection`),
    or a ConfigError saying how to configure one."""
    from streamsched.kafka.clients import connection

    settings = connection(conn).registry
    if settings is None:
        raise ConfigError("a topic in the registry wire format needs a schema registry: set "
                          "STREAMSCHED_REGISTRY_URL (or --registry-url, or [registry] url in the "
                          "connection file)")
    return RegistryClient(settings)
