"""The domain event: a workflow transition, and the bounds every transition satisfies.

Pure: the wire encoding lives in :mod:`streamsched.wire.transition`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from typing import Any

from streamsched.errors import DecodeError
from streamsched.model.fastinit import fast_init
from streamsched.model.jsonval import Bad, json_dumps, json_loads, json_parse
from streamsched.model.limits import MAX_EVENT_ID_LENGTH, MAX_PAYLOAD_BYTES, MAX_TARGET_COMPONENTS

MAX_EVENT_TYPE_LENGTH = 64
"""Longest transition ``type`` (characters)."""


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class TransitionEvent:
    """A decoded ``TransitionEvent`` record (``schemas/transition.avsc``).

    ``payload`` holds JSON bytes (see :meth:`json`); times are nanoseconds since the epoch.
    ``attempt`` and ``origin`` are keyword-only. ``origin`` is ``None`` or the occurrence a
    schedule fired (``sched:<catalog>:<name>:<version>:<planned_ns>``); its grammar belongs to
    the wire (:func:`streamsched.wire.schedule.origin_problem`), which refuses anything else.
    """

    event_id: str
    type: str
    tenant: str
    target: tuple[str, ...]
    due_ns: int
    payload: bytes
    produced_ns: int
    _: dataclasses.KW_ONLY
    attempt: int = 1
    origin: str | None = None

    def json(self) -> object:
        """The decoded JSON payload (raises :class:`DecodeError` if it is not valid JSON)."""
        return json_loads(self.payload)

    def to_record(self) -> dict[str, Any]:
        """The Avro record dict of this event."""
        return {
            "event_id": self.event_id,
            "type": self.type,
            "tenant": self.tenant,
            "target": list(self.target),
            "due_ns": self.due_ns,
            "payload": self.payload,
            "produced_ns": self.produced_ns,
            "attempt": self.attempt,
            "origin": self.origin,
        }


def transition_problem(ev: TransitionEvent) -> str | None:
    """The first bound ``ev`` violates, or ``None``; field types are already schema-checked."""
    if not 0 < len(ev.event_id) <= MAX_EVENT_ID_LENGTH:
        return "bound: event_id"
    if not 0 < len(ev.type) <= MAX_EVENT_TYPE_LENGTH:
        return "bound: type"
    # Byte bounds of tenant and target components belong to streamsched.model.identity, which
    # every consumer applies; only the component count is also a wire bound.
    if len(ev.target) > MAX_TARGET_COMPONENTS:
        return "bound: target components"
    if ev.due_ns < 0:
        return "bound: due_ns"
    if ev.attempt < 1:
        return "bound: attempt"
    if len(ev.payload) > MAX_PAYLOAD_BYTES:
        return "bound: payload size"
    parsed = json_parse(ev.payload)
    if isinstance(parsed, Bad):
        return f"payload: {parsed.reason}"
    return None


EVENT_FIELDS = frozenset({"type", "tenant", "target", "due_ns", "payload", "event_id", "produced_ns",
                          "attempt", "origin"})
"""The keys of an event's JSON shape (``streamsched emit --event``, :func:`event_from_mapping`)."""


def _field(doc: Mapping[str, object], name: str, kind: type, default: object) -> Any:
    value = doc.get(name, default)
    # bool is an int subclass: True as a due time or attempt is a mistake, not 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DecodeError(f"encode: field {name} must be {kind.__name__}")
    return value


def event_from_mapping(doc: Mapping[str, object]) -> TransitionEvent:
    """A :class:`TransitionEvent` from its JSON shape, the one every producer-side entry point
    takes (``streamsched emit``, the Faust integration).

    Keys (:data:`EVENT_FIELDS`): ``type`` (required); ``tenant`` (default ``""``); ``target`` (a
    list of strings, or one string); ``due_ns`` (default 0); ``payload`` (any JSON value, or JSON
    ``bytes``; default ``{}``); ``event_id`` (default a random UUID: give one to deduplicate
    downstream); ``produced_ns`` (default now); ``attempt`` (default 1); ``origin`` (default
    none). Types are checked here, bounds by the wire encoder; anything else raises
    :class:`DecodeError` (``"encode: ..."``) naming the field, never its value.
    """
    unknown = [k for k in doc if k not in EVENT_FIELDS]
    if unknown:
        raise DecodeError(f"encode: unknown event fields {sorted(map(str, unknown))}")
    if "type" not in doc:
        raise DecodeError("encode: an event needs a 'type'")
    target = doc.get("target", ())
    if isinstance(target, str):
        target = (target,)
    if not isinstance(target, list | tuple) or not all(isinstance(t, str) for t in target):
        raise DecodeError("encode: field target must be a string or a list of strings")
    payload = doc.get("payload", {})
    origin = doc.get("origin")
    if origin is not None and not isinstance(origin, str):
        raise DecodeError("encode: field origin must be str")
    event_id = doc.get("event_id")
    return TransitionEvent(
        event_id=uuid.uuid4().hex if event_id is None else _field(doc, "event_id", str, None),
        type=_field(doc, "type", str, None),
        tenant=_field(doc, "tenant", str, ""),
        target=tuple(target),
        due_ns=_field(doc, "due_ns", int, 0),
        payload=bytes(payload) if isinstance(payload, bytes | bytearray) else json_dumps(payload),
        produced_ns=_field(doc, "produced_ns", int, time.time_ns()),
        attempt=_field(doc, "attempt", int, 1),
        origin=origin,
    )
