"""Wire bytes of a :class:`~streamsched.model.event.TransitionEvent` (schema id 1).

The writer and the reader live together: anything :func:`decode_transition` would reject,
:func:`encode_transition` refuses to write, so no poison record is ever produced by us.
"""

from __future__ import annotations

from streamsched.errors import DecodeError
from streamsched.model.event import TransitionEvent, transition_problem
from streamsched.model.jsonval import Buffer
from streamsched.wire.avro import get_codec

__all__ = ["TransitionEvent", "decode_transition", "encode_transition"]


def encode_transition(ev: TransitionEvent) -> bytes:
    """Wire bytes of ``ev``; refuses (``DecodeError("encode: ...")``) anything
    :func:`decode_transition` would reject, so no poison record is ever produced."""
    data = get_codec("transition").encode(ev.to_record())
    problem = transition_problem(ev)
    if problem is not None:
        raise DecodeError(f"encode: {problem}")
    return data


def decode_transition(data: Buffer) -> TransitionEvent:
    """Decode and bound-check a transition event; raises only :class:`DecodeError`.

    Besides the :meth:`AvroCodec.decode` reasons: ``"bound: <field>"`` for a field outside
    its bound and ``"payload: invalid json"`` / ``"payload: bound: json depth"``.
    """
    rec = get_codec("transition").decode(data)
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
    problem = transition_problem(ev)
    if problem is not None:
        raise DecodeError(problem)
    return ev
