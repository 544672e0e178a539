"""Wire formats of the schedule catalog, and the ``origin`` a fired event carries.

Definitions, states and history rows are Avro records (schema ids 4, 5, 6). A fired event's
``origin`` (written by the ticker, read back by target workers to report an attempt's result on
the catalog's feedback topic) is ``sched:<catalog>:<name>:<version>:<planned_ns>``; the writer
:func:`occurrence_origin` and the reader :func:`parse_origin` live here together.

An origin is checked when a transition is decoded (:func:`origin_problem`): a malformed one
would otherwise only fail when the worker derives the feedback topic from it, inside the
release transaction, and stall the partition. It must be ``None`` or well formed: a valid
catalog name whose feedback topic name is legal, a valid schedule name, a version >= 0 and a
planned time, both canonical decimal integers within int64.

An operator's trigger or backfill (:class:`~streamsched.model.schedule.Request`) is a record of
the catalog's definitions topic, on its schedule's partition, under the key
``<name>\x00request/<request-id>`` (:func:`request_key`): a key no schedule name can have, so
compaction never merges it with the definition, and readers of definitions tell the two apart
by the key alone. Its value is canonical JSON (sorted keys), checked field by field by
:func:`decode_request`; the ticker skips and counts one that does not pass.

A state record's headers (:func:`state_headers`) say what its Avro body cannot without a new
schema, which records already written could not be read with: the definition version it was
written for (:data:`VERSION_HEADER`), how far the ticker got with the schedule's operator
requests (:data:`PROGRESS_HEADER`, canonical JSON checked by :func:`decode_progress`) and what
its overlap policy tracks (:data:`RUNNING_HEADER`, :func:`decode_running`). A definition's
overlap policy is likewise a header of its record (:data:`OVERLAP_HEADER`; absent: ``allow``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from streamsched.errors import DecodeError, InvalidName
from streamsched.model.instants import MAX_BOUNDARY_NS, MIN_BOUNDARY_NS
from streamsched.model.jsonval import json_dumps, json_loads
from streamsched.model.names import internal_topic, validate_name
from streamsched.model.overlap import IDLE, OVERLAPS, Overlap, Running
from streamsched.model.schedule import MAX_BACKFILL, MAX_REASON, Definition, Request, RequestProgress, State
from streamsched.wire.avro import AvroCodec

DEFINITION_CODEC = AvroCodec("schedule_definition")
STATE_CODEC = AvroCodec("schedule_state")
HISTORY_CODEC = AvroCodec("history")
ORIGIN_PREFIX = "sched:"
ORIGIN_PROBLEM: Final = "origin: malformed"
"""The fixed, payload-free reason a transition with a malformed ``origin`` is refused for."""
_VERSION: Final = re.compile(r"0|[1-9][0-9]{0,18}")
_PLANNED: Final = re.compile(r"0|-?[1-9][0-9]{0,18}")
_INT64_MAX: Final = 2**63 - 1
REQUEST_SEP: Final = "\x00request/"
"""Between the schedule name and the request id in a request's key (names never hold NUL)."""
_REQUEST_ID: Final = re.compile(r"[0-9a-f]{32}")
_REQUEST_FIELDS: Final = frozenset(("kind", "name", "version", "at_ns", "request_id", "from_ns", "to_ns",
                                    "max"))
VERSION_HEADER: Final = "ss-version"
"""State record header: the definition version the state was written for (decimal)."""
PROGRESS_HEADER: Final = "ss-requests"
"""State record header: the schedule's request progress (:func:`encode_progress`); absent when
there is none."""
MAX_PROGRESS: Final = 64
"""Most request progress entries one state carries (the newest requests are kept)."""
_PROGRESS_FIELDS: Final = frozenset(("done", "done_to", "fired"))
RUNNING_HEADER: Final = "ss-running"
"""State record header: the overlap policy's tracking (:func:`encode_running`); absent when idle."""
_RUNNING_FIELDS: Final = frozenset(("pending", "buffered", "skips"))
OVERLAP_HEADER: Final = "ss-overlap"
"""Definition record header: its overlap policy when not ``allow`` (``skip``, ``buffer_one``)."""


def occurrence_origin(catalog: str, defn: Definition, planned_ns: int) -> str:
    """The ``origin`` of a fired event: ``sched:<catalog>:<name>:<version>:<planned_ns>``.

    ``<schedule-id>/<planned-ns>`` is the occurrence's stable identity; the target worker
    reads the origin to report the attempt's result back to the catalog.
    """
    return f"{ORIGIN_PREFIX}{catalog}:{defn.name}:{defn.version}:{planned_ns}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    catalog: str
    name: str
    version: int
    planned_ns: int

    @property
    def schedule_id(self) -> str:
        return f"{self.name}.v{self.version}"

    @property
    def occurrence(self) -> str:
        return f"{self.schedule_id}/{self.planned_ns}"

    @property
    def feedback_topic(self) -> str:
        """The catalog's topic this occurrence's attempt results are reported on."""
        return internal_topic("schedules", self.catalog, "feedback")


def parse_origin(origin: str | None) -> Occurrence | None:
    """The occurrence ``origin`` names, or ``None`` if it is absent or not well formed.

    Strict (no signs, spaces or underscores in the numbers; names validated), so that whatever
    parses here can be written back to its catalog without an error.
    """
    if not origin or not origin.startswith(ORIGIN_PREFIX):
        return None
    parts = origin[len(ORIGIN_PREFIX):].split(":")
    if len(parts) != 4:
        return None
    catalog, name, version, planned = parts
    if not (_VERSION.fullmatch(version) and _PLANNED.fullmatch(planned)):
        return None
    v, p = int(version), int(planned)
    if v > _INT64_MAX or not -_INT64_MAX - 1 <= p <= _INT64_MAX:
        return None
    try:
        validate_name(name, "schedule")
        occ = Occurrence(validate_name(catalog, "catalog"), name, v, p)
        occ.feedback_topic  # noqa: B018 - the derived topic name must be legal too
    except InvalidName:
        return None
    return occ


def origin_problem(origin: str | None) -> str | None:
    """:data:`ORIGIN_PROBLEM` unless ``origin`` is ``None`` or a well-formed occurrence origin."""
    if origin is None or parse_origin(origin) is not None:
        return None
    return ORIGIN_PROBLEM


def request_key(name: str, request_id: str) -> str:
    """The definitions-topic key of a request: ``<name>\\x00request/<request-id>``."""
    return f"{name}{REQUEST_SEP}{request_id}"


def request_name(key: str) -> str | None:
    """The schedule a definitions-topic key is a request of, or None for a definition's key."""
    name, sep, _ = key.partition(REQUEST_SEP)
    return name if sep else None


def encode_request(req: Request) -> bytes:
    return json_dumps(req.to_record())


def _int(doc: dict[str, object], field: str, low: int, high: int, *, what: str = "request") -> int:
    value = doc[field]
    if type(value) is not int or not low <= value <= high:
        raise DecodeError(f"{what}: {field}")
    return value


def decode_request(key: str, value: bytes) -> Request:
    """The request stored under ``key``; :class:`DecodeError` naming the first bad field."""
    doc = json_loads(value)
    if not isinstance(doc, dict):
        raise DecodeError("request: fields")
    kind = doc.get("kind")
    if set(doc) != (_REQUEST_FIELDS | {"reason"} if kind == "pause" else _REQUEST_FIELDS):
        raise DecodeError("request: fields")
    name, request_id = doc["name"], doc["request_id"]
    if kind not in ("trigger", "backfill", "pause", "resume"):
        raise DecodeError("request: kind")
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise DecodeError("request: request_id")
    if not isinstance(name, str) or key != request_key(name, request_id):
        raise DecodeError("request: key")
    try:
        validate_name(name, "schedule")
    except InvalidName:
        raise DecodeError("request: name") from None
    version = _int(doc, "version", 1, _INT64_MAX)
    at_ns = _int(doc, "at_ns", MIN_BOUNDARY_NS, MAX_BOUNDARY_NS)
    if kind != "backfill":
        if doc["from_ns"] is not None or doc["to_ns"] is not None or doc["max"] != 0:
            raise DecodeError(f"request: a {kind} has no window")
        reason = doc.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON or not reason.isprintable():
            raise DecodeError("request: reason")
        return Request(kind, name, version, at_ns, request_id, reason=reason)
    from_ns = _int(doc, "from_ns", MIN_BOUNDARY_NS, MAX_BOUNDARY_NS)
    to_ns = _int(doc, "to_ns", from_ns, MAX_BOUNDARY_NS)
    return Request("backfill", name, version, at_ns, request_id, from_ns, to_ns,
                   _int(doc, "max", 1, MAX_BACKFILL))


def encode_progress(items: Sequence[RequestProgress]) -> bytes:
    """``{"<request-id>": {"done": ..., "done_to": ..., "fired": ...}}`` as canonical JSON."""
    return json_dumps({p.request_id: {"done": p.done, "done_to": p.done_to, "fired": p.fired} for p in items})


def decode_progress(value: bytes) -> tuple[RequestProgress, ...]:
    """The entries :func:`encode_progress` wrote; :class:`DecodeError` naming the first bad part."""
    doc = json_loads(value)
    if not isinstance(doc, dict) or len(doc) > MAX_PROGRESS:
        raise DecodeError("progress: entries")
    out = []
    for request_id, entry in doc.items():
        if not _REQUEST_ID.fullmatch(request_id):
            raise DecodeError("progress: request_id")
        if not isinstance(entry, dict) or set(entry) != _PROGRESS_FIELDS or type(entry["done"]) is not bool:
            raise DecodeError("progress: fields")
        done_to = (None if entry["done_to"] is None
                   else _int(entry, "done_to", MIN_BOUNDARY_NS, MAX_BOUNDARY_NS, what="progress"))
        fired = _int(entry, "fired", 0, MAX_BACKFILL, what="progress")
        out.append(RequestProgress(request_id, done_to, fired, entry["done"]))
    return tuple(out)


def encode_running(running: Running) -> bytes:
    """``{"buffered": ..., "pending": ..., "skips": ...}`` as canonical JSON."""
    return json_dumps({"pending": running.pending_ns, "buffered": running.buffered_ns,
                       "skips": running.skips})


def decode_running(value: bytes) -> Running:
    """What :func:`encode_running` wrote; :class:`DecodeError` naming the first bad part."""
    doc = json_loads(value)
    if not isinstance(doc, dict) or set(doc) != _RUNNING_FIELDS:
        raise DecodeError("running: fields")
    pending, buffered = (None if doc[f] is None
                         else _int(doc, f, MIN_BOUNDARY_NS, MAX_BOUNDARY_NS, what="running")
                         for f in ("pending", "buffered"))
    return Running(pending, buffered, _int(doc, "skips", 0, _INT64_MAX, what="running"))


def with_running(st: State, headers: Sequence[tuple[str, bytes]] | None) -> State:
    """``st`` with what its record's :data:`RUNNING_HEADER` says the overlap policy tracks (idle
    without one); :class:`DecodeError` for a header that does not read."""
    raw = header(headers, RUNNING_HEADER)
    return st if raw is None else replace(st, running=decode_running(raw))


def state_headers(version: int, progress: Sequence[RequestProgress] = (),
                  running: Running = IDLE) -> list[tuple[str, bytes]]:
    """The headers of a state record written for definition ``version`` (module docs)."""
    headers = [(VERSION_HEADER, str(version).encode())]
    if progress:
        headers.append((PROGRESS_HEADER, encode_progress(progress)))
    if not running.idle:
        headers.append((RUNNING_HEADER, encode_running(running)))
    return headers


def definition_headers(defn: Definition) -> list[tuple[str, bytes]] | None:
    """The headers of ``defn``'s record: its overlap policy unless it is ``allow``."""
    return None if defn.overlap == "allow" else [(OVERLAP_HEADER, defn.overlap.encode())]


def overlap_of(headers: Sequence[tuple[str, bytes]] | None) -> Overlap:
    """The overlap policy a definition record's headers name; :class:`DecodeError` for one that
    is not known (the ticker then keeps the previous definition, as for any unreadable one)."""
    value = header(headers, OVERLAP_HEADER)
    if value is None:
        return "allow"
    text = value.decode("utf-8", "replace")
    if text not in OVERLAPS:
        raise DecodeError("definition: overlap")
    return text  # type: ignore[return-value]  # one of the Literal's values, checked above


def header(headers: Sequence[tuple[str, bytes]] | None, name: str) -> bytes | None:
    """The value of the last header ``name`` of a record, or None."""
    found = None
    for key, value in headers or ():
        if key == name:
            found = value
    return found


def written_for(headers: Sequence[tuple[str, bytes]] | None) -> int | None:
    """The definition version a state record was written for, if its header says."""
    value = header(headers, VERSION_HEADER)
    if value is None:
        return None
    try:
        return int(value.decode())
    except (ValueError, UnicodeDecodeError):
        return None


def decode_definition(value: bytes, headers: Sequence[tuple[str, bytes]] | None) -> Definition:
    """The definition a record of the definitions topic holds, its overlap policy included;
    :class:`DecodeError` (or the model's ``KeyError``/``ValueError``) when it does not read."""
    defn = Definition.from_record(DEFINITION_CODEC.decode(value))
    overlap = overlap_of(headers)
    return defn if overlap == "allow" else replace(defn, overlap=overlap)
