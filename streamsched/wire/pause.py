"""The pause record: an operator's durable "pause" or "resume" of one scheduler.

Records go to the scheduler's control topic (``__streamsched.control.<scheduler>``, one
partition, kept forever): every worker of the scheduler reads it from the beginning before it
takes any claim, and follows it while it runs. The last record is the scheduler's state, so a
worker that starts, restarts or takes over a partition while the scheduler is paused starts
paused; the records before it are the audit trail of who paused and resumed it, when and why.

The record: key = the request id (every request is kept: compaction or retention never removes
the history), value = canonical JSON ``{"v": 1, "paused": bool, "principal", "at_ns", "reason",
"request"}``. Reasons and principals are cut to 200 printable characters.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from streamsched.errors import DecodeError
from streamsched.model.jsonval import Bad, json_dumps, json_parse
from streamsched.wire.control import MAX_PRINCIPAL, MAX_REASON, printable

__all__ = ["MAX_PAUSE_BYTES", "PauseRecord"]

MAX_PAUSE_BYTES = 2048
"""Largest pause record accepted (a larger one is undecodable)."""


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """One pause or resume request of a scheduler."""

    paused: bool
    principal: str
    at_ns: int
    reason: str = ""
    request: str = ""

    @classmethod
    def new(cls, paused: bool, *, principal: str, at_ns: int, reason: str = "") -> PauseRecord:
        return cls(paused, printable(principal, MAX_PRINCIPAL), at_ns, printable(reason, MAX_REASON),
                   uuid.uuid4().hex)

    @property
    def key(self) -> bytes:
        return self.request.encode()

    def encode(self) -> bytes:
        return json_dumps({"v": 1, "paused": self.paused, "principal": self.principal, "at_ns": self.at_ns,
                           "reason": self.reason, "request": self.request})

    @classmethod
    def decode(cls, value: bytes | None) -> PauseRecord:
        """The record ``value`` holds; :class:`DecodeError` (payload-free) if it is malformed."""
        if value is None or len(value) > MAX_PAUSE_BYTES:
            raise DecodeError("pause: missing or oversize record")
        doc = json_parse(value)
        if isinstance(doc, Bad) or not isinstance(doc, dict) or doc.get("v") != 1:
            raise DecodeError("pause: malformed record")
        paused, principal, at_ns = doc.get("paused"), doc.get("principal"), doc.get("at_ns")
        reason, request = doc.get("reason", ""), doc.get("request", "")
        if not isinstance(paused, bool):
            raise DecodeError("pause: malformed record")
        if not isinstance(at_ns, int) or isinstance(at_ns, bool) or at_ns < 0:
            raise DecodeError("pause: record without a time")
        if not (isinstance(principal, str) and isinstance(reason, str) and isinstance(request, str)):
            raise DecodeError("pause: malformed record")
        return cls(paused, printable(principal, MAX_PRINCIPAL), at_ns, printable(reason, MAX_REASON),
                   printable(request, 64))

    def to_dict(self) -> dict[str, object]:
        return {"paused": self.paused, "principal": self.principal, "at_ns": self.at_ns,
                "reason": self.reason, "request": self.request}
