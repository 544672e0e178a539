"""Least-authority Kafka ACLs of a scheduler role (SPEC §4), planned from the app and applied.

A scheduler's worker needs exactly (``P`` its principal, every entry ALLOW from any host)::

    TOPIC  <transition topic>          READ, WRITE, DESCRIBE  consume; WRITE forwards a record
                                                              that landed on the wrong partition
    TOPIC  __streamsched.delay.<s>     READ, WRITE, DESCRIBE  park retries, read them back
    TOPIC  __streamsched.state.<s>     READ, WRITE, DESCRIBE  claims/outcomes; restore reads it
    TOPIC  __streamsched.dlq.<s>       WRITE, DESCRIBE        dead letters
    TOPIC  <each declared output>      WRITE, DESCRIBE        what its Kafka-native commands emit
    GROUP  <its group>                 READ                   join, fetch and commit offsets
    TRANSACTIONAL_ID (prefixed)
           streamsched.<group>.<topic>.  WRITE, DESCRIBE      one fenced producer per partition
    TOPIC  __streamsched.schedules.<c>.feedback  WRITE, DESCRIBE   only with --catalog c

Nothing else: no CREATE (run workers with ``--no-create-topics``; an operator applies topics),
no ALTER, no other scheduler's topics, groups or transactional ids. No ``IdempotentWrite`` on the
cluster: since Kafka 2.8 (KIP-679) a producer holding WRITE on any topic may initialise an
idempotent producer, and the transactional producers are authorised by their transactional id.

The transactional-id prefix is the narrowest one covering every partition's id
(``streamsched.<group>.<topic>.<p>``, see :mod:`streamsched.worker.intake`), so the ACLs stay
right when partitions are added.

``apply`` sends CreateAcls (and ``describe`` DescribeAcls) through aiokafka's admin client, whose
0.14 protocol module has the requests but no public method for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from streamsched.errors import ConfigError, StreamschedError
from streamsched.kafka import clients
from streamsched.model.names import internal_topic, validate_name
from streamsched.worker.app import App, SchedulerDef

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


def transactional_prefix(s: SchedulerDef) -> str:
    """The prefix every transactional id of ``s``'s partition owners starts with."""
    return f"streamsched.{s.group}.{s.topic}."


def plan_scheduler(s: SchedulerDef, principal: str, *, catalogs: Iterable[str] = ()) -> list[Acl]:
    """The exact ACLs the worker of scheduler ``s`` needs (module docs), sorted."""
    p = principal_of(principal)
    out: list[Acl] = []

    def add(rtype: str, name: str, ops: Iterable[str], why: str, pattern: str = "LITERAL") -> None:
        out.extend(Acl(rtype, pattern, name, op, p, why=why) for op in ops)

    add("TOPIC", s.topic, ("READ", "WRITE", "DESCRIBE"),
        "transition topic: consume; forward misrouted records")
    add("TOPIC", s.delay_topic, ("READ", "WRITE", "DESCRIBE"), "delay topic: park retries and read them back")
    add("TOPIC", s.state_topic, ("READ", "WRITE", "DESCRIBE"), "state topic: claims and outcomes; restore")
    add("TOPIC", s.dead_letter_topic, ("WRITE", "DESCRIBE"), "dead-letter topic")
    for topic in sorted(s.outputs):
        add("TOPIC", topic, ("WRITE", "DESCRIBE"), "declared output of a Kafka-native command")
    for catalog in sorted(set(catalogs)):
        add("TOPIC", internal_topic("schedules", validate_name(catalog, "catalog"), "feedback"),
            ("WRITE", "DESCRIBE"), f"attempt results of schedule catalog {catalog}")
    add("GROUP", s.group, ("READ",), "consumer group: join, fetch and commit offsets")
    add("TRANSACTIONAL_ID", transactional_prefix(s), ("WRITE", "DESCRIBE"),
        "fenced transactional producer of each partition", pattern="PREFIXED")
    return sorted(set(out))


def plan_app(app: App, *, principal: str | None = None, scheduler: str | None = None,
             catalogs: Iterable[str] = ()) -> list[Acl]:
    """ACLs of every scheduler of ``app`` (or one): each under ``principal``, else ``User:<name>``."""
    names = [scheduler] if scheduler else list(app.schedulers)
    unknown = [n for n in names if n not in app.schedulers]
    if unknown:
        raise ConfigError(f"no scheduler named {unknown[0]!r} in app {app.name}")
    acls: set[Acl] = set()
    for name in names:
        acls.update(plan_scheduler(app.schedulers[name], principal or f"User:{name}", catalogs=catalogs))
    return sorted(acls)


def format_plan(acls: list[Acl], *, as_json: bool = False) -> str:
    """The plan as JSON (tooling) or as a table (resource, pattern, operation, principal, why)."""
    if as_json:
        return json.dumps([a.as_dict() for a in acls], indent=2)
    rows = [("PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", "WHY")]
    rows += [(a.principal, a.resource_type, a.pattern_type, a.resource_name, a.operation, a.why)
             for a in acls]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
                     for r in rows)


async def apply(conn: clients.Conn, acls: Iterable[Acl]) -> int:
    """Create ``acls`` (idempotent: an existing binding is not an error); returns how many were sent.

    Needs a principal allowed to ALTER the cluster (the local broker's ``admin``)."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import CreateAclsRequest

    acls = sorted(set(acls))
    admin = clients.admin(conn)
    await admin.start()
    try:
        for a in acls:
            request = CreateAclsRequest(RESOURCE_TYPES[a.resource_type], a.resource_name,
                                        PATTERN_TYPES[a.pattern_type], a.principal, a.host,
                                        OPERATIONS[a.operation], PERMISSIONS[a.permission])
            response = await admin._send_request(request)
            for code, _message in response.creation_responses:
                if code:
                    raise AclError(f"the broker refused to create an ACL ({for_code(code).__name__})")
    finally:
        await admin.close()
    return len(acls)


async def describe(conn: clients.Conn, principal: str | None = None) -> list[Acl]:
    """Every ALLOW/DENY binding the cluster holds (of ``principal`` only, if given), sorted."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import DescribeAclsRequest

    codes = {v: k for k, v in RESOURCE_TYPES.items()}
    patterns = {v: k for k, v in PATTERN_TYPES.items()}
    ops = {v: k for k, v in OPERATIONS.items()}
    perms = {v: k for k, v in PERMISSIONS.items()}
    admin = clients.admin(conn)
    await admin.start()
    try:
        # None (null) filters match anything.
        request = DescribeAclsRequest(RESOURCE_TYPES["ANY"], None, PATTERN_TYPES["ANY"],
                                      principal_of(principal) if principal else None, None,
                                      OPERATIONS["ANY"], PERMISSIONS["ANY"])
        response: Any = await admin._send_request(request)
    finally:
        await admin.close()
    if response.error_code:
        raise AclError(f"the broker refused to describe ACLs ({for_code(response.error_code).__name__})")
    out: list[Acl] = []
    for rtype, name, pattern, entries in response.resources:
        for who, host, op, perm in entries:
            out.append(Acl(codes.get(rtype, str(rtype)), patterns.get(pattern, str(pattern)), name,
                           ops.get(op, str(op)), who, host, perms.get(perm, str(perm))))
    return sorted(out)
