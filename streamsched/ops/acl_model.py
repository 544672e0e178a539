"""The model of a Kafka ACL plan: one ALLOW binding (:class:`Acl`), a principal's collected
bindings, and Kafka's wire codes. Shared by every role's plan (:mod:`streamsched.ops.acl`,
:mod:`streamsched.ops.acl_dr`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from streamsched.errors import ConfigError, StreamschedError

RESOURCE_TYPES = {"ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"ANY": 1, "ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7,
              "DESCRIBE": 8, "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11,
              "IDEMPOTENT_WRITE": 12}
PERMISSIONS = {"ANY": 1, "DENY": 2, "ALLOW": 3}
"""Kafka's wire codes (``org.apache.kafka.common.acl``/``resource``)."""


class AclError(StreamschedError):
    """The broker refused to create or describe ACLs."""

    kind = "acl"


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding: ``principal`` may ``operation`` on the resource."""

    resource_type: str
    pattern_type: str
    resource_name: str
    operation: str
    principal: str
    host: str = "*"
    permission: str = "ALLOW"
    why: str = field(default="", compare=False)
    """Why the role needs it (shown by ``acl plan``; not part of the binding)."""

    def key(self) -> tuple[str, str, str, str, str, str, str]:
        """The binding itself, without the explanation."""
        return (self.resource_type, self.pattern_type, self.resource_name, self.operation,
                self.principal, self.host, self.permission)

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def principal_of(text: str) -> str:
    """``User:NAME`` (a bare NAME gets the ``User:`` type)."""
    kind, sep, name = text.partition(":")
    if not sep:
        kind, name = "User", text
    if not kind or not name or any(c.isspace() for c in text):
        raise ConfigError(f"a principal is TYPE:NAME, e.g. User:pipelines (got {text!r})")
    return f"{kind}:{name}"


class _Plan:
    """The ALLOW bindings of one principal, collected (duplicates fold) and sorted."""

    def __init__(self, principal: str) -> None:
        self.principal = principal_of(principal)
        self.acls: set[Acl] = set()

    def add(self, rtype: str, name: str, ops: Iterable[str], why: str, pattern: str = "LITERAL") -> None:
        self.acls.update(Acl(rtype, pattern, name, op, self.principal, why=why) for op in ops)

    def done(self) -> list[Acl]:
        return sorted(self.acls)


