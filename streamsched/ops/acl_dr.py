"""Least-authority ACLs of the disaster-recovery roles: MirrorMaker 2 on each side, and the
operator who fails over (``acl plan --role mirror-source|mirror-target|failover``). ``P`` is the
role's principal, every entry ALLOW from any host; ``T`` ranges over the mirrored topics (each
scheduler's transition, state, delay, dead-letter, audit and control topics, each catalog's four
topics) and ``G`` over their groups (each scheduler's, each catalog's ticker group).

**mirror-source**, MirrorMaker's principal on the primary (read only)::

    TOPIC  T                  READ, DESCRIBE, DESCRIBE_CONFIGS   copy records and settings
    GROUP  G                  DESCRIBE                           the groups' committed offsets
    CLUSTER kafka-cluster     DESCRIBE                           list the groups

**mirror-target**, MirrorMaker's principal on the secondary (``A`` its name of the primary)::

    TOPIC  T                  WRITE, READ, DESCRIBE,             write the copies, keep their
                              ALTER_CONFIGS                      settings in step; READ: committing
                                                                 a translated offset of T needs it
    TOPIC  mm2- (prefixed)    CREATE, READ, WRITE, DESCRIBE,     its own state: configs, offsets,
                              DESCRIBE_CONFIGS                   status, offset syncs
    TOPIC  A.checkpoints.internal               likewise         translated offsets
    TOPIC  heartbeats         CREATE, WRITE, DESCRIBE,           liveness
                              DESCRIBE_CONFIGS
    GROUP  G                  READ, DESCRIBE                     commit the translated offsets
    GROUP  A-mm2              READ                               its own worker group

No CREATE on ``T``: the secondary's topics are an operator's, made with ``topics apply
--source-*`` (which checks them against the primary's); MirrorMaker cannot make one of another
shape. Each binding was found needed by running without it, or kept for a check MirrorMaker makes
of its own topics (DESCRIBE_CONFIGS: that they are compacted).

**failover**, the operator who runs ``streamsched dr failover`` on the secondary::

    TOPIC  A.checkpoints.internal   READ, DESCRIBE     the translated offsets
    TOPIC  T                        READ, DESCRIBE     committing an offset of T needs READ
    GROUP  G                        READ, DESCRIBE     its members (refused if any); commit

``tests/security/test_acl_dr.py`` runs MirrorMaker and the failover with exactly these on two
secured clusters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamsched.errors import ConfigError
from streamsched.ops.acl_model import Acl, _Plan
from streamsched.ops.mirror import SOURCE_ALIAS, check_alias, checkpoints_topic

if TYPE_CHECKING:
    from streamsched.worker.app import App

ROLES = ("mirror-source", "mirror-target", "failover")
CLUSTER = "kafka-cluster"
_OWN = ("CREATE", "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")


def _need(topics: Iterable[str], groups: Iterable[str]) -> tuple[list[str], list[str]]:
    t, g = sorted(set(topics)), sorted(set(groups))
    if not t:
        raise ConfigError("a disaster-recovery role needs the mirrored topics (--app or --catalog)")
    return t, g


def plan_mirror_source(topics: Iterable[str], groups: Iterable[str], principal: str) -> list[Acl]:
    """MirrorMaker's ACLs on the primary (module docs)."""
    t, g = _need(topics, groups)
    plan = _Plan(principal)
    for topic in t:
        plan.add("TOPIC", topic, ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"),
                 "mirrored: copy records and settings")
    for group in g:
        plan.add("GROUP", group, ("DESCRIBE",), "mirrored group: its committed offsets")
    plan.add("CLUSTER", CLUSTER, ("DESCRIBE",), "list the groups to mirror")
    return plan.done()


def plan_mirror_target(topics: Iterable[str], groups: Iterable[str], principal: str, *,
                       source_alias: str = SOURCE_ALIAS) -> list[Acl]:
    """MirrorMaker's ACLs on the secondary (module docs)."""
    t, g = _need(topics, groups)
    alias = check_alias(source_alias)
    plan = _Plan(principal)
    for topic in t:
        plan.add("TOPIC", topic, ("WRITE", "READ", "DESCRIBE", "ALTER_CONFIGS"),
                 "mirrored: write the copies, keep settings in step, commit translated offsets")
    plan.add("TOPIC", "mm2-", _OWN, "MirrorMaker's own configs, offsets, status, offset syncs",
             pattern="PREFIXED")
    plan.add("TOPIC", checkpoints_topic(alias), _OWN, "translated group offsets")
    plan.add("TOPIC", "heartbeats", ("CREATE", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
             "MirrorMaker's heartbeats")
    for group in g:
        plan.add("GROUP", group, ("READ", "DESCRIBE"), "mirrored group: commit translated offsets")
    plan.add("GROUP", f"{alias}-mm2", ("READ",), "MirrorMaker's own worker group")
    return plan.done()


def plan_failover(topics: Iterable[str], groups: Iterable[str], principal: str, *,
                  source_alias: str = SOURCE_ALIAS) -> list[Acl]:
    """The ACLs of an operator running ``dr failover`` on the secondary (module docs)."""
    t, g = _need(topics, groups)
    plan = _Plan(principal)
    plan.add("TOPIC", checkpoints_topic(source_alias), ("READ", "DESCRIBE"), "the translated offsets")
    for topic in t:
        plan.add("TOPIC", topic, ("READ", "DESCRIBE"), "committing a group offset of it")
    for group in g:
        plan.add("GROUP", group, ("READ", "DESCRIBE"), "members (refused if any); commit the offsets")
    return plan.done()


def mirrored(app: App | None, scheduler: str | None,
             catalogs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The topics and groups ``dr mirror`` mirrors for ``app`` (or its ``scheduler``) and ``catalogs``."""
    from streamsched.schedules.catalog import Catalog

    topics: list[str] = []
    groups: list[str] = []
    for sched in app.select(scheduler) if app is not None else ():
        topics += [sched.topic, *(s.name for s in sched.internal_topics(1, None))]
        groups.append(sched.group)
    for name in catalogs:
        cat = Catalog("", name)  # validates the name; only its topic and group names are used
        topics += [s.name for s in cat.topic_specs()]
        groups.append(cat.group)
    return topics, groups


def plan_role(role: str, app: App | None, scheduler: str | None, catalogs: Iterable[str], principal: str,
              source_alias: str) -> list[Acl]:
    """The plan of one of :data:`ROLES`."""
    topics, groups = mirrored(app, scheduler, catalogs)
    if role == "mirror-source":
        return plan_mirror_source(topics, groups, principal)
    if role == "mirror-target":
        return plan_mirror_target(topics, groups, principal, source_alias=source_alias)
    return plan_failover(topics, groups, principal, source_alias=source_alias)
