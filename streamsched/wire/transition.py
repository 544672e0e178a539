"""Wire bytes of a :class:`~streamsched.model.event.TransitionEvent` (schema id 1).

The writer and the reader live together: anything :func:`decode_transition` would reject,
:func:`encode_transition` refuses to write, so no poison record is ever produced by us.

Besides the field bounds of :func:`~streamsched.model.event.transition_problem`, the ``origin``
must be absent or a well-formed occurrence origin (:func:`~streamsched.wire.schedule.origin_problem`):
a malformed one is a decode error, so the worker dead-letters it instead of failing later when it
reports the attempt to the origin's catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamsched.errors import DecodeError
from streamsched.model.event import TransitionEvent, transition_problem
from streamsched.model.jsonval import Buffer
from streamsched.wire.avro import get_codec
from streamsched.wire.schedule import origin_problem

__all__ = ["TransitionEvent", "decode_transition", "encode_transition", "event_from_record"]


def encode_transition(ev: TransitionEvent) -> bytes:
    """Wire bytes of ``ev``; refuses (``DecodeError("encode: ...")``) anything
    :func:`decode_transition` would reject, so no poison record is ever produced."""
    data = get_codec("transition").encode(ev.to_record())
    problem = _problem(ev)
    if problem is not None:
        raise DecodeError(f"encode: {problem}")
    return data


def decode_transition(data: Buffer) -> TransitionEvent:
    """Decode and bound-check a transition event; raises only :class:`DecodeError`.

    Besides the :meth:`AvroCodec.decode` reasons: ``"bound: <field>"`` for a field outside
    its bound, ``"payload: invalid json"`` / ``"payload: bound: json depth"`` and
    ``"origin: malformed"``.
    """
    return event_from_record(get_codec("transition").decode(data))


def event_from_record(rec: Mapping[str, Any]) -> TransitionEvent:
    """The event of a decoded transition record (schema-typed), bound-checked; raises
    :class:`DecodeError` with the reasons of :func:`decode_transition` beyond Avro's own."""
    ev = TransitionEvent(
        event_id=rec["event_id"],
        type=rec["type"],
        tenant=rec["tenant"],
        target=tuple(rec["target"]),
        due_ns=rec["due_ns"],
        payload=rec["payload"],
        produced_ns=rec["produced_ns"],
        attempt=rec["attempt"],
        origin=rec["origin"],
    )
    problem = _problem(ev)
    if problem is not None:
        raise DecodeError(problem)
    return ev


def _problem(ev: TransitionEvent) -> str | None:
    return transition_problem(ev) or origin_problem(ev.origin)
