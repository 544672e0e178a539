"""The domain event: a workflow transition, and the bounds every transition satisfies.

Pure: the wire encoding lives in :mod:`streamsched.wire.transition`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamsched.model.jsonval import Bad, json_loads, json_parse
from streamsched.model.limits import MAX_EVENT_ID_LENGTH, MAX_PAYLOAD_BYTES, MAX_TARGET_COMPONENTS

MAX_EVENT_TYPE_LENGTH = 64
"""Longest transition ``type`` (characters)."""


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
