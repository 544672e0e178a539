"""Re-drive and cancel requests: an operator's control records, applied by the identity's owner.

A re-drive reopens a stored outcome so that the identity executes again; a cancel stores a
cancelled outcome for work that waits (a parked retry, an event deferred until its due time) so
that it never runs. Neither may race the partition's owner, so neither is a write to the state
topic: each is a record on the scheduler's delay topic, in the identity's home partition, which
only the worker (and an operator role) may write. The owning turn reads it like any parked
record, applies it in a transaction of its own partition, and moves the offset past it in that
same transaction.

The record:

* header :data:`CONTROL_HEADER` = ``redrive`` or ``cancel`` (a record of the delay topic without
  it is an ordinary parked transition) and header :data:`REQUEST_HEADER`, the request as
  canonical JSON (:class:`RedriveRequest`: the identity, the revision the operator saw,
  ``force``, principal, time, reason and a request id; a cancel's is the same document, its
  action is the control header's); the due-time header says "now";
* value: the transition event to run again, exactly as it was produced (from a dead letter or
  ``--event``), or none (``--identity``: only reopen; the identity's next delivery runs). A
  cancel never carries one;
* key: the event's route key, or the identity when there is no event.

The request names the revision the operator saw: the owner applies it only if the identity is
still at that revision, so a request delivered twice (a crash before its offset committed) or
overtaken by a newer execution is refused instead of running the identity a second time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from streamsched.errors import DecodeError
from streamsched.model.identity import IDENTITY_PATTERN
from streamsched.model.jsonval import Bad, json_dumps, json_parse
from streamsched.wire.delay import DUE_HEADER

__all__ = [
    "CANCEL",
    "CONTROL_HEADER",
    "MAX_REASON",
    "REDRIVE",
    "REQUEST_HEADER",
    "AuditEntry",
    "RedriveRequest",
    "control_kind",
    "decode_request",
    "printable",
    "redrive_headers",
]

CONTROL_HEADER = "ss-control"
"""Header naming a control record's kind."""
REQUEST_HEADER = "ss-redrive"
"""Header carrying the re-drive request (canonical JSON)."""
REDRIVE = b"redrive"
CANCEL = b"cancel"
_ACTIONS = {REDRIVE: "redrive", CANCEL: "cancel"}
MAX_REASON = 200
"""Longest reason (characters); longer ones are cut, control characters replaced."""
MAX_PRINCIPAL = 200
_MAX_REQUEST_BYTES = 2048

Header = tuple[str, bytes]


def printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, each unprintable one replaced by '?': what an
    operator's reason or a principal may show in a log line or a terminal."""
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    """Reopen (or, ``action`` ``cancel``, cancel) ``identity`` if it is still at ``revision``
    (what the operator inspected)."""

    identity: str
    revision: int
    principal: str
    at_ns: int
    reason: str = ""
    force: bool = False
    request: str = ""
    """A unique id of the request (one per identity per command run), for the audit trail."""
    action: str = "redrive"
    """``redrive`` or ``cancel``: carried by the record's control header, not in the JSON (so a
    re-drive's record is what it always was)."""

    @classmethod
    def new(cls, identity: str, revision: int, *, principal: str, at_ns: int, reason: str = "",
            force: bool = False, action: str = "redrive") -> RedriveRequest:
        if action not in _ACTIONS.values() or (force and action != "redrive"):
            raise ValueError("a control request is a redrive (maybe forced) or a cancel")
        return cls(identity, revision, printable(principal, MAX_PRINCIPAL), at_ns,
                   printable(reason, MAX_REASON), force, uuid.uuid4().hex, action)

    def encode(self) -> bytes:
        return json_dumps({"v": 1, "identity": self.identity, "revision": self.revision,
                           "principal": self.principal, "at_ns": self.at_ns, "reason": self.reason,
                           "force": self.force, "request": self.request})


def redrive_headers(request: RedriveRequest) -> list[Header]:
    """The headers of a re-drive (or cancel) record (due now)."""
    kind = CANCEL if request.action == "cancel" else REDRIVE
    return [(CONTROL_HEADER, kind), (REQUEST_HEADER, request.encode()), (DUE_HEADER, b"0")]


def control_kind(headers: Iterable[Header] | None) -> bytes | None:
    """The control header's value, or None for an ordinary record."""
    for key, value in headers or ():
        if key == CONTROL_HEADER:
            return bytes(value)
    return None


def decode_request(headers: Iterable[Header] | None) -> RedriveRequest:
    """The request of a re-drive or cancel record (its action is the control header's; none:
    a re-drive); :class:`DecodeError` (a payload-free reason) if it has none or it is malformed."""
    headers = list(headers or ())
    kind = control_kind(headers)
    action = _ACTIONS.get(kind if kind is not None else REDRIVE)
    if action is None:
        raise DecodeError("control: unknown kind")
    raw = next((bytes(v) for k, v in headers if k == REQUEST_HEADER), None)
    if raw is None:
        raise DecodeError("control: re-drive without its request header")
    if len(raw) > _MAX_REQUEST_BYTES:
        raise DecodeError("control: oversize re-drive request")
    doc = json_parse(raw)
    if isinstance(doc, Bad) or not isinstance(doc, dict) or doc.get("v") != 1:
        raise DecodeError("control: malformed re-drive request")
    identity, revision, at_ns = doc.get("identity"), doc.get("revision"), doc.get("at_ns")
    principal, reason, force, request = (doc.get("principal"), doc.get("reason", ""), doc.get("force", False),
                                         doc.get("request", ""))
    if not isinstance(identity, str) or not IDENTITY_PATTERN.fullmatch(identity):
        raise DecodeError("control: re-drive of a malformed identity")
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
        raise DecodeError("control: re-drive without a revision")
    if not isinstance(at_ns, int) or isinstance(at_ns, bool) or at_ns < 0:
        raise DecodeError("control: re-drive without a time")
    if not (isinstance(principal, str) and isinstance(reason, str) and isinstance(force, bool)
            and isinstance(request, str)):
        raise DecodeError("control: malformed re-drive request")
    if force and action != "redrive":
        raise DecodeError("control: a forced cancel")
    return RedriveRequest(identity, revision, printable(principal, MAX_PRINCIPAL), at_ns,
                          printable(reason, MAX_REASON), force, printable(request, 64), action)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """What the owner did with a re-drive or cancel request: one record of the scheduler's audit
    topic, keyed by the identity (``inspect`` shows an identity's entries; safe fields only)."""

    identity: str
    request: str
    principal: str
    requested_ns: int
    applied_ns: int
    reason: str
    result: str
    """``reopened`` (a re-drive), ``cancelled`` (a cancel), or ``refused``."""
    why: str = ""
    """Why a request was refused: ``changed`` (not at the revision inspected), ``live_claim``,
    ``succeeded`` (a re-drive without force), ``nothing_stored`` (a re-drive),
    ``nothing_waiting`` (a cancel of an identity whose outcome is stored)."""
    outcome_before: str = ""
    fence: int = 0
    revision: int = 0
    """The revision the identity has after the entry (reopened, cancelled) or had (refused)."""
    action: str = "redrive"
    """``redrive`` or ``cancel`` (entries written before cancel existed say ``redrive``)."""

    def encode(self) -> bytes:
        return json_dumps({"v": 1, "action": self.action, "identity": self.identity, "request": self.request,
                           "principal": self.principal, "requested_ns": self.requested_ns,
                           "applied_ns": self.applied_ns, "reason": self.reason, "result": self.result,
                           "why": self.why, "outcome_before": self.outcome_before, "fence": self.fence,
                           "revision": self.revision})

    @classmethod
    def decode(cls, value: bytes | None) -> AuditEntry:
        doc = json_parse(value) if value is not None and len(value) <= 4 * _MAX_REQUEST_BYTES else Bad("size")
        if isinstance(doc, Bad) or not isinstance(doc, dict) or doc.get("v") != 1:
            raise DecodeError("audit: malformed entry")
        try:
            return cls(str(doc["identity"]), str(doc["request"]), str(doc["principal"]),
                       int(doc["requested_ns"]), int(doc["applied_ns"]), str(doc["reason"]),
                       str(doc["result"]), str(doc["why"]), str(doc["outcome_before"]),
                       int(doc["fence"]), int(doc["revision"]), str(doc.get("action", "redrive")))
        except (KeyError, TypeError, ValueError):
            raise DecodeError("audit: malformed entry") from None

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}


def redrive_record(request: RedriveRequest, event: bytes | None, route_key: bytes | None
                   ) -> tuple[bytes, bytes | None, list[Header]]:
    """Key, value and headers of the delay-topic record carrying ``request`` (and the encoded
    transition ``event`` to run again, with its ``route_key``; or neither: only reopen)."""
    if (event is None) != (route_key is None):
        raise ValueError("an event to run again needs its route key, and only then")
    if event is not None and request.action != "redrive":
        raise ValueError("a cancel carries no event")
    key = route_key if route_key is not None else request.identity.encode()
    return key, event, redrive_headers(request)
