"""Least-authority Kafka ACLs of each role, planned and applied: schedulers, tickers and
service producers. ``P`` is the role's principal; every entry is ALLOW from any host.

A **scheduler**'s worker (:func:`plan_scheduler`, ``acl plan --app MOD:ATTR``)::

    TOPIC  <transition topic>          READ, WRITE, DESCRIBE  consume; WRITE forwards a record
                                                              that landed on the wrong partition
    TOPIC  __streamsched.delay.<s>     READ, WRITE, DESCRIBE  park retries, read them back
    TOPIC  __streamsched.state.<s>     READ, WRITE, DESCRIBE  claims/outcomes; restore reads it
    TOPIC  __streamsched.dlq.<s>       WRITE, DESCRIBE        dead letters
    TOPIC  __streamsched.control.<s>   READ, DESCRIBE         operators' pause and resume
    TOPIC  <each declared output>      WRITE, DESCRIBE        what its Kafka-native commands emit
    GROUP  <its group>                 READ                   join, fetch and commit offsets
    TRANSACTIONAL_ID (prefixed)
           streamsched:scheduler:<group>:<topic>:  WRITE, DESCRIBE   one fenced producer per partition
    TOPIC  __streamsched.schedules.<c>.feedback  WRITE, DESCRIBE   only with --catalog c

A **ticker** of catalog ``c`` (:func:`plan_ticker`, ``acl plan --role ticker --catalog c
--target T``)::

    TOPIC  __streamsched.schedules.<c>.definitions  READ, DESCRIBE            restore, follow
    TOPIC  __streamsched.schedules.<c>.state        READ, WRITE, DESCRIBE     restore; advance
    TOPIC  __streamsched.schedules.<c>.history      WRITE, DESCRIBE           history rows
    TOPIC  __streamsched.schedules.<c>.feedback     READ, DESCRIBE            attempt results
    TOPIC  each of the four above                   DESCRIBE_CONFIGS          verified at start
    TOPIC  <each --target>             WRITE, DESCRIBE        the occurrences it fires
    GROUP  streamsched.schedules.<c>   READ                   its group; feedback offsets
    TRANSACTIONAL_ID (prefixed)  streamsched:ticker:<c>:  WRITE, DESCRIBE

Which topics a ticker fires into is runtime data (each schedule's target, written by whoever may
write the catalog), so the plan takes them explicitly: the ``--target`` topics (and, with
``--app``, the transition topics of that app's schedulers). A catalog writer cannot make the
ticker write anywhere else: the broker refuses the write of a schedule whose target is not among
them, and nothing of that transaction is written. That also stalls the schedule's catalog
partition (its owner fails with TopicAuthorizationFailedError and restarts with backoff; the
partition's other schedules wait with it) until the target is granted or the schedule changed.
DESCRIBE_CONFIGS (read-only) is there because the ticker verifies its catalog topics' settings
at start (``Catalog.ensure_topics``); without CREATE it never creates them.

An **operator** of a scheduler (:func:`plan_operator`, ``acl plan --role operator --app MOD:ATTR
--principal P``): what ``inspect``, ``redrive``, ``pause`` and ``resume`` need, nothing that
changes claim state::

    TOPIC  <transition topic>          DESCRIBE               its partition count (home partitions)
    TOPIC  __streamsched.state.<s>     READ, DESCRIBE         the identities' snapshots
    TOPIC  __streamsched.audit.<s>     READ, DESCRIBE         the re-drive audit trail
    TOPIC  __streamsched.dlq.<s>       READ, DESCRIBE         redrive --from-dlq
    TOPIC  __streamsched.delay.<s>     WRITE, DESCRIBE        re-drive requests (applied by the owner)
    TOPIC  __streamsched.control.<s>   READ, WRITE, DESCRIBE  pause and resume (and their history)
    GROUP  <its group>                 DESCRIBE               the group's committed offsets

A re-drive request is only honoured from the delay topic, which services cannot write, and the
owner applies it in its own transaction; the operator never writes the state topic.

A **service producer** (:class:`streamsched.Producer`, the outbox relay; :func:`plan_producer`,
``acl plan --role producer --topic T``): WRITE, DESCRIBE on each transition topic it produces
to. Nothing else: no READ, no group, no transactional id.

The disaster-recovery roles (MirrorMaker on each side, the failover operator) are planned in
:mod:`streamsched.ops.acl_dr`.

No role gets CREATE (run workers with ``--no-create-topics``; an operator applies topics), ALTER,
another role's topics, groups or transactional ids, or ``IdempotentWrite`` on the cluster: since
Kafka 2.8 (KIP-679) a producer holding WRITE on any topic may initialise an idempotent producer
(``tests/security`` proves it for each role), and transactional producers are authorised by
their transactional id.

The transactional-id prefix (:func:`streamsched.model.names.transactional_prefix`) is the
narrowest one covering every partition's id, so the ACLs stay right when partitions are added;
its separator is outside the name grammar, so it never covers another owner's ids.

``apply`` sends CreateAcls (and ``describe`` DescribeAcls) through aiokafka's admin client, whose
0.14 protocol module has the requests but no public method for them. :func:`add_acl_arguments`
and :func:`run_acl` are the ``streamsched acl`` command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from streamsched.errors import ConfigError
from streamsched.model.names import internal_topic, transactional_prefix, validate_name
from streamsched.ops.acl_model import (
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    Acl,
    AclError,
    _Plan,
    principal_of,
)

if TYPE_CHECKING:  # the CLI's parser imports this module: Kafka, Avro and the app model stay lazy
    from streamsched.kafka import clients
    from streamsched.worker.app import App, SchedulerDef

def plan_scheduler(s: SchedulerDef, principal: str, *, catalogs: Iterable[str] = ()) -> list[Acl]:
    """The exact ACLs the worker of scheduler ``s`` needs (module docs), sorted."""
    plan = _Plan(principal)
    add = plan.add
    add("TOPIC", s.topic, ("READ", "WRITE", "DESCRIBE"),
        "transition topic: consume; forward misrouted records")
    add("TOPIC", s.delay_topic, ("READ", "WRITE", "DESCRIBE"), "delay topic: park retries and read them back")
    add("TOPIC", s.state_topic, ("READ", "WRITE", "DESCRIBE"), "state topic: claims and outcomes; restore")
    add("TOPIC", s.dead_letter_topic, ("WRITE", "DESCRIBE"), "dead-letter topic")
    add("TOPIC", s.audit_topic, ("WRITE", "DESCRIBE"), "audit topic: what it did with operators' re-drives")
    add("TOPIC", s.control_topic, ("READ", "DESCRIBE"), "control topic: operators' pause and resume")
    for topic in sorted(s.outputs):
        add("TOPIC", topic, ("WRITE", "DESCRIBE"), "declared output of a Kafka-native command")
    for catalog in sorted(set(catalogs)):
        add("TOPIC", internal_topic("schedules", validate_name(catalog, "catalog"), "feedback"),
            ("WRITE", "DESCRIBE"), f"attempt results of schedule catalog {catalog}")
    add("GROUP", s.group, ("READ",), "consumer group: join, fetch and commit offsets")
    add("TRANSACTIONAL_ID", transactional_prefix("scheduler", s.group, s.topic), ("WRITE", "DESCRIBE"),
        "fenced transactional producer of each partition", pattern="PREFIXED")
    return plan.done()


def plan_app(app: App, *, principal: str | None = None, scheduler: str | None = None,
             catalogs: Iterable[str] = ()) -> list[Acl]:
    """ACLs of every scheduler of ``app`` (or one): each under ``principal``, else ``User:<name>``."""
    acls: set[Acl] = set()
    for sched in app.select(scheduler):
        acls.update(plan_scheduler(sched, principal or f"User:{sched.name}", catalogs=catalogs))
    return sorted(acls)


def plan_operator(s: SchedulerDef, principal: str) -> list[Acl]:
    """The exact ACLs of an operator who inspects and re-drives scheduler ``s`` (module docs)."""
    plan = _Plan(principal)
    add = plan.add
    add("TOPIC", s.topic, ("DESCRIBE",), "transition topic: partition count (home partitions)")
    add("TOPIC", s.state_topic, ("READ", "DESCRIBE"), "state topic: the identities' snapshots")
    add("TOPIC", s.audit_topic, ("READ", "DESCRIBE"), "audit topic: what owners did with re-drives")
    add("TOPIC", s.dead_letter_topic, ("READ", "DESCRIBE"), "dead-letter topic: redrive --from-dlq")
    add("TOPIC", s.delay_topic, ("WRITE", "DESCRIBE"), "delay topic: re-drive requests for the owners")
    add("TOPIC", s.control_topic, ("READ", "WRITE", "DESCRIBE"), "control topic: pause and resume requests")
    add("GROUP", s.group, ("DESCRIBE",), "consumer group: committed offsets (inspect)")
    return plan.done()


def plan_ticker(catalog: str, targets: Iterable[str], principal: str) -> list[Acl]:
    """The exact ACLs of a ticker of ``catalog`` that may fire into ``targets`` (module docs)."""
    targets = sorted(set(targets))
    if not targets:
        raise ConfigError("a ticker role needs the topics it may fire into (--target TOPIC or --app)")
    from streamsched.schedules.catalog import Catalog

    cat = Catalog("", catalog)  # validates the name; only its topic and group names are used
    plan = _Plan(principal)
    add = plan.add
    add("TOPIC", cat.definitions_topic, ("READ", "DESCRIBE"), "schedule definitions: restore and follow")
    add("TOPIC", cat.state_topic, ("READ", "WRITE", "DESCRIBE"), "schedule states: restore; advance")
    add("TOPIC", cat.history_topic, ("WRITE", "DESCRIBE"), "history rows of fired occurrences")
    add("TOPIC", cat.feedback_topic, ("READ", "DESCRIBE"), "attempt results from target workers")
    for topic in (cat.definitions_topic, cat.state_topic, cat.history_topic, cat.feedback_topic):
        add("TOPIC", topic, ("DESCRIBE_CONFIGS",), "catalog topic settings verified at start")
    for topic in targets:
        add("TOPIC", validate_name(topic, "topic"), ("WRITE", "DESCRIBE"), "target: occurrences it fires")
    add("GROUP", cat.group, ("READ",), "ticker group: join; commit feedback offsets")
    add("TRANSACTIONAL_ID", transactional_prefix("ticker", cat.name), ("WRITE", "DESCRIBE"),
        "fenced transactional producer of each catalog partition", pattern="PREFIXED")
    return plan.done()


def plan_producer(topics: Iterable[str], principal: str) -> list[Acl]:
    """The exact ACLs of a service producing transition events to ``topics`` with
    :class:`streamsched.Producer` or the outbox relay: WRITE and DESCRIBE (partition count) on
    each, nothing else (an idempotent producer needs no cluster permission, module docs)."""
    topics = sorted(set(topics))
    if not topics:
        raise ConfigError("a producer role needs the topics it produces to (--topic TOPIC or --app)")
    plan = _Plan(principal)
    for topic in topics:
        plan.add("TOPIC", validate_name(topic, "topic"), ("WRITE", "DESCRIBE"),
                 "transition topic it produces events to")
    return plan.done()


def format_plan(acls: list[Acl], *, as_json: bool = False, held: Iterable[Acl] | None = None) -> str:
    """The plan as JSON (tooling) or as a table (principal, resource, pattern, name, operation,
    why). With ``held`` (the bindings a cluster holds), each entry also says whether it is among
    them: JSON ``"held": true|false``, a HELD column (yes/no) before WHY."""
    held_keys = None if held is None else {a.key() for a in held}
    if as_json:
        return json.dumps([a.as_dict() | ({} if held_keys is None else {"held": a.key() in held_keys})
                           for a in acls], indent=2)
    extra = () if held_keys is None else ("HELD",)
    rows = [("PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", *extra, "WHY")]
    rows += [(a.principal, a.resource_type, a.pattern_type, a.resource_name, a.operation,
              *(() if held_keys is None else ("yes" if a.key() in held_keys else "no",)), a.why)
             for a in acls]
    columns = len(rows[0]) - 1  # every column but WHY is padded
    widths = [max(len(r[i]) for r in rows) for i in range(columns)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:columns], widths, strict=True)) + "  " + r[-1]
                     for r in rows)


async def apply(conn: clients.Conn, acls: Iterable[Acl]) -> int:
    """Create ``acls`` (idempotent: an existing binding is not an error); returns how many were sent.

    Needs a principal allowed to ALTER the cluster (the local broker's ``admin``)."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import CreateAclsRequest

    from streamsched.kafka import clients, compat

    acls = sorted(set(acls))
    admin = clients.admin(conn)
    await admin.start()
    try:
        for a in acls:
            request = CreateAclsRequest(RESOURCE_TYPES[a.resource_type], a.resource_name,
                                        PATTERN_TYPES[a.pattern_type], a.principal, a.host,
                                        OPERATIONS[a.operation], PERMISSIONS[a.permission])
            response = await compat.send_request(admin, request)
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

    from streamsched.kafka import clients, compat

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
        response: Any = await compat.send_request(admin, request)
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


# --- the `streamsched acl` command -------------------------------------------------------------

ROLES = ("scheduler", "ticker", "producer", "operator", "mirror-source", "mirror-target", "failover")
HELP = ("print (plan) or create (apply) the least-authority Kafka ACLs of a scheduler, ticker, producer, "
        "operator or disaster-recovery role")


def add_acl_arguments(parser: argparse.ArgumentParser, fn: Any = None) -> None:
    """The ``acl`` command's actions, ``plan`` (no Kafka needed) and ``apply`` (with the
    connection options), each its own subparser; ``fn`` (default :func:`run_acl`) runs them."""
    from streamsched.ops.cli.grammar import Parser, add_connection, add_output

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser)
    for name, text in (("plan", "print the ACLs a role needs (no Kafka needed; with --config, which "
                                "ones the cluster holds)"),
                       ("apply", "create the ACLs a role needs (as an operator allowed to alter ACLs)")):
        p = actions.add_parser(name, help=text, description=text[:1].upper() + text[1:])
        p.add_argument("--role", choices=ROLES, default="scheduler",
                       help="scheduler: an app's workers; ticker: the ticker of --catalog, firing into "
                            "--target; producer: a service producing to --topic; operator: inspect and "
                            "redrive an app's schedulers; mirror-source/mirror-target: MirrorMaker on the "
                            "primary/secondary cluster for --app and --catalog; failover: `dr failover`")
        p.add_argument("--app", default=None, metavar="MODULE:ATTR",
                       help="MODULE:ATTR of a streamsched.App. scheduler role: its schedulers' roles "
                            "(required); ticker/producer role: also may write its schedulers' topics")
        p.add_argument("--scheduler", default=None, metavar="NAME",
                       help="only this scheduler of --app (default: every one)")
        p.add_argument("--principal", default=None,
                       help="User:NAME the ACLs are for (scheduler default: User:<scheduler name>; "
                            "required for ticker and producer)")
        p.add_argument("--catalog", action="append", default=None, metavar="NAME",
                       help="scheduler role: a schedule catalog whose occurrences it runs (may write "
                            "its feedback topic); ticker role: the catalog it ticks (repeatable)")
        p.add_argument("--target", action="append", default=None, metavar="TOPIC",
                       help="ticker role: a topic its schedules may fire into (repeatable)")
        p.add_argument("--topic", action="append", default=None, metavar="TOPIC",
                       help="producer role: a transition topic it produces to (repeatable)")
        p.add_argument("--source-alias", default="primary",
                       help="mirror-target and failover roles: MirrorMaker's name of the primary")
        if name == "plan":
            add_output(p, json_alias="--format")
            p.add_argument("--config", default=None, metavar="FILE",
                           help="a connection file (this flag only, no variable): also show which of the "
                                "ACLs the cluster it names holds already, as `acl apply --config FILE` "
                                "would see them (column HELD; \"held\" in json)")
        else:
            add_output(p, default="json", json_alias=None)
            add_connection(p)
        p.set_defaults(fn=fn or run_acl)


def plan_from_args(args: argparse.Namespace) -> list[Acl]:
    """The plan ``acl`` arguments ask for (a :class:`ConfigError` names a flag that does not fit)."""
    role = getattr(args, "role", "scheduler")
    misplaced = {"scheduler": ("target", "topic"), "ticker": ("topic",), "producer": ("target", "catalog"),
                 "operator": ("target", "topic", "catalog")}
    misplaced |= dict.fromkeys(("mirror-source", "mirror-target", "failover"), ("target", "topic"))
    for name in misplaced[role]:
        if getattr(args, name, None):
            raise ConfigError(f"--{name} does not apply to --role {role}")
    app = None
    if args.app is not None:
        from streamsched.ops.cli.common import load_app  # the CLI's loader: one-line errors

        app = load_app(args.app)
    elif args.scheduler:
        raise ConfigError("--scheduler selects a scheduler of --app")
    if role == "scheduler":
        if app is None:
            raise ConfigError("--role scheduler needs --app MODULE:ATTR")
        return plan_app(app, principal=args.principal, scheduler=args.scheduler, catalogs=args.catalog or ())
    if not args.principal:
        raise ConfigError(f"--role {role} needs --principal User:NAME")
    if role in ("mirror-source", "mirror-target", "failover"):
        from streamsched.ops.acl_dr import plan_role

        return plan_role(role, app, args.scheduler, args.catalog or (), args.principal,
                         getattr(args, "source_alias", "primary"))
    if role == "operator":
        if app is None:
            raise ConfigError("--role operator needs --app MODULE:ATTR")
        return sorted({a for sched in app.select(args.scheduler)
                       for a in plan_operator(sched, args.principal)})
    topics = set(args.target or args.topic or ())
    if app is not None:
        topics |= {s.topic for s in app.select(args.scheduler)}
    if role == "producer":
        return plan_producer(topics, args.principal)
    if not args.catalog:
        raise ConfigError("--role ticker needs --catalog NAME")
    return sorted({a for c in args.catalog for a in plan_ticker(c, topics, args.principal)})


def run_acl(args: argparse.Namespace) -> int:
    """``acl plan`` prints the plan (with ``--config``, whether the cluster holds each binding
    already: what ``acl apply`` would add); ``acl apply`` creates it (as an operator allowed to
    alter ACLs) and prints ``{"applied": N, "principals": [...]}``."""
    from streamsched.ops.config import resolve_connection

    acls = plan_from_args(args)
    if args.action == "plan":
        held = None
        if args.config is not None:
            # The file's connection, as `acl apply --config FILE` resolves it (flags aside).
            held = asyncio.run(describe(resolve_connection({"config": args.config})))
        print(format_plan(acls, as_json=args.output == "json", held=held))
        return 0

    applied = asyncio.run(apply(resolve_connection(args), acls))
    from streamsched.ops.cli.output import show

    show(args, {"applied": applied, "principals": sorted({a.principal for a in acls})})
    return 0
