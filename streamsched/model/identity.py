"""Stable business identities: a domain-separated, canonical, length-prefixed encoding, hashed.

``sched_<sha256 hex>`` is a pure function of the scheduler's config and the event's logical
fields, so every process and Python version computes the same value (golden vectors in
tests/test_identity.py). The digest never reveals tenant or target text. Claim and release
identities additionally bind the nonzero delivery ordinal so a redelivery can never replay an
obsolete fence.

Encoding (all integers big-endian)::

    b"streamsched/business-identity/v1\x00", then for each field in order:
        u8 field number, u32 length, value bytes
    fields: 1 version "v1", 2 scheduler, 3 topic, 4 selection, 5 due_ns (u64),
            6 tenant, 7 canonical target, 8 attempt kind
    strings are UTF-8; target is u8 count then (u32 length, bytes) per component

    claim / release identity = sha256(b"streamsched/claim-identity/v1\x00" (or release-)
                                      + 32-byte business digest + u64 ordinal)
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from streamsched.errors import BoundExceeded, InvalidName
from streamsched.model.limits import MAX_COMPONENT_BYTES, MAX_TARGET_BYTES, MAX_TARGET_COMPONENTS
from streamsched.model.names import validate_name

IDENTITY_VERSION = "v1"
_BUSINESS_DOMAIN = b"streamsched/business-identity/v1\x00"
_CLAIM_DOMAIN = b"streamsched/claim-identity/v1\x00"
_RELEASE_DOMAIN = b"streamsched/release-identity/v1\x00"
_ROUTE_DOMAIN = b"streamsched/route-key/v1\x00"
_PREFIX = "sched_"
_U64_MAX = 2**64 - 1
IDENTITY_PATTERN = re.compile(r"sched_[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class IdentityParts:
    """Everything a business identity binds. Build one per work item; hash with :func:`business_identity`."""

    scheduler: str
    topic: str
    selection: str
    due_ns: int
    tenant: str
    target: tuple[str, ...]
    attempt_kind: str


def _utf8(value: object, what: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidName(what, "must be a string")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName(what, "is not valid Unicode text") from None
    if len(raw) > limit:
        raise BoundExceeded(f"{what} bytes", limit, len(raw))
    return raw


def _field(number: int, raw: bytes) -> bytes:
    return struct.pack(">BI", number, len(raw)) + raw


def canonical_target(target: tuple[str, ...] | list[str]) -> bytes:
    """Canonical bytes of the target-key suffix, validated against the identity bounds."""
    if not isinstance(target, (tuple, list)):
        # A bare string would iterate into characters and collide with a tuple of them.
        raise InvalidName("target", "must be a tuple or list of strings")
    if len(target) > MAX_TARGET_COMPONENTS:
        raise BoundExceeded("target components", MAX_TARGET_COMPONENTS, len(target))
    out = bytearray(struct.pack(">B", len(target)))
    for component in target:
        raw = _utf8(component, "target component", MAX_TARGET_BYTES)
        out += struct.pack(">I", len(raw)) + raw
    if len(out) > MAX_TARGET_BYTES:
        raise BoundExceeded("canonical target bytes", MAX_TARGET_BYTES, len(out))
    return bytes(out)


def canonical_encoding(parts: IdentityParts) -> bytes:
    """The exact bytes hashed into the business identity (exposed for golden tests)."""
    validate_name(parts.scheduler, "scheduler")
    validate_name(parts.topic, "topic")
    validate_name(parts.selection, "selection")
    validate_name(parts.attempt_kind, "attempt kind")
    if not isinstance(parts.due_ns, int) or isinstance(parts.due_ns, bool):
        raise InvalidName("due_ns", "must be an integer")
    if not 0 <= parts.due_ns <= _U64_MAX:
        raise BoundExceeded("due_ns", _U64_MAX if parts.due_ns > 0 else 0, parts.due_ns)
    return b"".join(
        (
            _BUSINESS_DOMAIN,
            _field(1, IDENTITY_VERSION.encode()),
            _field(2, parts.scheduler.encode()),
            _field(3, parts.topic.encode()),
            _field(4, parts.selection.encode()),
            _field(5, struct.pack(">Q", parts.due_ns)),
            _field(6, _utf8(parts.tenant, "tenant", MAX_COMPONENT_BYTES)),
            _field(7, canonical_target(parts.target)),
            _field(8, parts.attempt_kind.encode()),
        )
    )


def business_identity(parts: IdentityParts) -> str:
    """``sched_<hex>``: stable across redelivery, retries, processes and restarts."""
    return _PREFIX + hashlib.sha256(canonical_encoding(parts)).hexdigest()


class IdentityResolver:
    """:func:`business_identity` for one scheduler, with its fixed fields validated once.

    The worker resolves one identity per record; the scheduler, topic, selection and attempt
    kind never change, so their encoding is a precomputed prefix of the hashed bytes.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, scheduler: str, topic: str, selection: str, attempt_kind: str) -> None:
        probe = IdentityParts(scheduler, topic, selection, 0, "", (), attempt_kind)
        canonical_encoding(probe)  # validates the fixed fields
        self._head = b"".join((_BUSINESS_DOMAIN, _field(1, IDENTITY_VERSION.encode()),
                               _field(2, scheduler.encode()), _field(3, topic.encode()),
                               _field(4, selection.encode())))
        self._tail = _field(8, attempt_kind.encode())

    def __call__(self, due_ns: int, tenant: str, target: tuple[str, ...]) -> str:
        _check_due(due_ns)
        return self._identity(due_ns, _field(6, _utf8(tenant, "tenant", MAX_COMPONENT_BYTES)),
                              _field(7, canonical_target(target)))

    def with_route_key(self, due_ns: int, tenant: str, target: tuple[str, ...]) -> tuple[str, bytes]:
        """``(self(due_ns, tenant, target), route_key(tenant, target))``, validating and encoding
        tenant and target once for both (the worker needs both for every record)."""
        _check_due(due_ns)
        tenant_field = _field(6, _utf8(tenant, "tenant", MAX_COMPONENT_BYTES))
        target_field = _field(7, canonical_target(target))
        return (self._identity(due_ns, tenant_field, target_field),
                _route_key_of(tenant_field, target_field))

    def _identity(self, due_ns: int, tenant_field: bytes, target_field: bytes) -> str:
        h = hashlib.sha256(self._head)
        h.update(_field(5, struct.pack(">Q", due_ns)))
        h.update(tenant_field)
        h.update(target_field)
        h.update(self._tail)
        return _PREFIX + h.hexdigest()


def _check_due(due_ns: int) -> None:
    if not isinstance(due_ns, int) or isinstance(due_ns, bool):
        raise InvalidName("due_ns", "must be an integer")
    if not 0 <= due_ns <= _U64_MAX:
        raise BoundExceeded("due_ns", _U64_MAX if due_ns > 0 else 0, due_ns)


def _check_identity(identity: str) -> bytes:
    if not (isinstance(identity, str) and IDENTITY_PATTERN.fullmatch(identity)):
        raise InvalidName("identity", "not a sched_<64 lower-case hex> business identity")
    return bytes.fromhex(identity[len(_PREFIX):])


def _bound_ordinal(domain: bytes, identity: str, ordinal: int) -> str:
    digest = _check_identity(identity)
    if not isinstance(ordinal, int) or isinstance(ordinal, bool):
        raise InvalidName("delivery ordinal", "must be an integer")
    if not 1 <= ordinal <= _U64_MAX:
        raise BoundExceeded("delivery ordinal", _U64_MAX if ordinal > 1 else 1, ordinal)
    return _PREFIX + hashlib.sha256(domain + digest + struct.pack(">Q", ordinal)).hexdigest()


def claim_identity(identity: str, ordinal: int) -> str:
    """Identity of the claim for one delivery attempt (ordinal >= 1)."""
    return _bound_ordinal(_CLAIM_DOMAIN, identity, ordinal)


def release_identity(identity: str, ordinal: int) -> str:
    """Identity of the release for one delivery attempt (ordinal >= 1)."""
    return _bound_ordinal(_RELEASE_DOMAIN, identity, ordinal)


def route_key(tenant: str, target: tuple[str, ...] | list[str]) -> bytes:
    """The Kafka record key a transition must carry.

    Every event of one business identity must land on one partition, or two group members could
    own it at once; keying by a digest of (tenant, target) guarantees that without putting
    plaintext tenant data in the key.
    """
    return _route_key_of(_field(6, _utf8(tenant, "tenant", MAX_COMPONENT_BYTES)),
                         _field(7, canonical_target(target)))


def _route_key_of(tenant_field: bytes, target_field: bytes) -> bytes:
    """The route key from the identity's tenant and target fields (numbered 6 and 7 there, 1
    and 2 in the route key: only the field number byte differs)."""
    raw = b"\x01" + tenant_field[1:] + b"\x02" + target_field[1:]
    return hashlib.sha256(_ROUTE_DOMAIN + raw).hexdigest()[:32].encode()
