"""``streamsched dr``: mirror a scheduler's topics to a secondary cluster (MirrorMaker 2), say how
far the mirror is behind, and move the groups to their translated positions for a failover.

The connection flags (``--bootstrap``, ``--config``, ...) name the *secondary* cluster, as they do
for ``topics apply --source-*`` there; ``--source-config`` / ``--source-bootstrap`` name the
primary. What to mirror is said as ``topics apply`` says it: ``--dir``, ``--app``, ``--catalog``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from streamsched.errors import ConfigError
from streamsched.kafka.admin import TopicSpec
from streamsched.kafka.clients import Connection
from streamsched.ops.cli.common import connect, load_app, stop_on_signals
from streamsched.ops.cli.grammar import Parser, add_connection, add_output, command, family
from streamsched.ops.cli.output import show


def add_scope(p: Parser, *, what: str) -> None:
    """The topic (and group) scope flags ``topics apply`` and ``dr`` share."""
    p.add_argument("--dir", default="topics", help="directory of *.toml topic definitions")
    p.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                   help=f"an app whose schedulers' state, dead-letter and delay topics to {what} too "
                        "(repeatable)")
    p.add_argument("--catalog", action="append", default=None, metavar="NAME",
                   help=f"a schedule catalog whose definitions, state, history and feedback topics to {what} "
                        "too (repeatable)")
    p.add_argument("--catalog-partitions", type=int, default=4,
                   help="partitions of those catalog topics (as `schedule add --partitions`)")


def add_source(p: Parser, *, required: bool) -> None:
    what = "the primary cluster (the mirror's source)"
    p.add_argument("--source-config", default=None, metavar="FILE",
                   help=f"connection file (as --config) of {what}")
    p.add_argument("--source-bootstrap", default=None, metavar="HOST:PORT",
                   help=f"bootstrap servers of {what}")
    if required:
        p.checks.append(lambda a: None if a.source_config or a.source_bootstrap else
                        "the following arguments are required: --source-config or --source-bootstrap")


def source_connection(args: argparse.Namespace) -> Connection | None:
    """The primary's connection from ``--source-*`` alone (never the secondary's variables)."""
    from streamsched.ops.config import resolve_connection

    if not (args.source_config or args.source_bootstrap):
        return None
    flags = {"config": args.source_config, "bootstrap": args.source_bootstrap}
    return resolve_connection(flags, env={}, local_state=None)


def scope(args: argparse.Namespace, bootstrap: Connection) -> tuple[list[TopicSpec], list[str]]:
    """The topics the flags name (definitions, then each app's and catalog's own), and the groups
    that read them (each scheduler's and each catalog's ticker)."""
    from streamsched.kafka.admin import load_dir
    from streamsched.schedules.catalog import Catalog

    specs = load_dir(Path(args.dir))
    if getattr(args, "replication", None):
        specs = [s.with_replication(args.replication) for s in specs]
    by_name = {s.name: s for s in specs}
    derived: list[TopicSpec] = []
    groups: list[str] = []
    for ref in args.app or ():
        for sched in load_app(ref).schedulers.values():
            base = by_name.get(sched.topic)
            if base is None:
                raise ConfigError(f"scheduler {sched.name}: topic {sched.topic} is not defined")
            if base.wire_format != sched.wire_format:
                raise ConfigError(f"scheduler {sched.name} reads {sched.topic} in the {sched.wire_format} "
                                  f"wire format, its definition says {base.wire_format}")
            derived.extend(sched.internal_topics(base.partitions, base.replication))
            groups.append(sched.group)
    for name in args.catalog or ():
        catalog = Catalog(bootstrap, name, partitions=args.catalog_partitions,
                          replication=getattr(args, "replication", None))
        derived.extend(catalog.topic_specs())
        groups.append(catalog.group)
    return [*specs, *derived], groups


def add_dr(sub: Any) -> None:
    fam = family(sub, "dr", "disaster recovery: mirror to a secondary cluster, its lag, failover")
    m = command(fam, "mirror", "run MirrorMaker 2 from the primary to this cluster until SIGTERM", cmd_dr)
    add_scope(m, what="mirror")
    add_source(m, required=True)
    m.add_argument("--group", action="append", default=[], help="another group whose offsets to translate")
    m.add_argument("--workdir", default=".streamsched/mirror", help="MirrorMaker's configuration and logs")
    m.add_argument("--mirror-option", action="append", default=[], metavar="KEY=VALUE",
                   help="another MirrorMaker setting (repeatable), e.g. "
                        "primary.consumer.fetch.max.wait.ms=500")
    m.add_argument("--replication", type=int, default=None,
                   help="replication factor of MirrorMaker's own topics (default min(3, brokers))")
    _aliases(m)
    add_connection(m)
    s = command(fam, "status", "per partition: what of the primary is not on this cluster yet", cmd_dr)
    add_scope(s, what="check")
    add_source(s, required=True)
    add_output(s, default="table", json_alias="--json")
    add_connection(s)
    f = command(fam, "failover", "commit the groups' translated offsets here, before workers start here",
                cmd_dr)
    add_scope(f, what="fail over")
    f.add_argument("--group", action="append", default=[], help="another group to move")
    f.add_argument("--dry-run", action="store_true", help="print the moves, commit nothing")
    _aliases(f)
    add_output(f, default="table", json_alias="--json")
    add_connection(f)


def _aliases(p: Parser) -> None:
    from streamsched.ops.mirror import SOURCE_ALIAS, TARGET_ALIAS

    p.add_argument("--source-alias", default=SOURCE_ALIAS, help="MirrorMaker's name of the primary")
    if p.prog.endswith("mirror"):
        p.add_argument("--target-alias", default=TARGET_ALIAS, help="MirrorMaker's name of this cluster")


def cmd_dr(args: argparse.Namespace) -> int:
    target = connect(args)
    specs, groups = scope(args, target)
    if args.action == "mirror":
        return _mirror(args, target, specs, [*groups, *args.group])
    if args.action == "status":
        from streamsched.ops.dr import mirror_status

        source = source_connection(args)
        assert source is not None  # required by the parser
        states = [s.name for s in specs if s.kind == "state"]
        status = asyncio.run(mirror_status(source, target, [s.name for s in specs], state_topics=states))
        show(args, status.to_dict(), lambda doc: _status_table(status))
        return 0
    from streamsched.ops.dr import failover
    from streamsched.ops.mirror import checkpoints_topic

    checkpoints = checkpoints_topic(args.source_alias)
    moves = asyncio.run(failover(target, [*groups, *args.group], checkpoints, dry_run=args.dry_run))
    rows = [dataclasses.asdict(m) for m in moves]
    show(args, {"groups": sorted({m.group for m in moves}), "moves": rows, "dry_run": args.dry_run},
         lambda doc: "\n".join(_move_line(m) for m in moves) or "no checkpoints for these groups: their "
         "workers here start from the earliest offsets (outcomes already mirrored are not run again)")
    return 0


def _mirror(args: argparse.Namespace, target: Connection, specs: list[TopicSpec], groups: list[str]) -> int:
    from streamsched.kafka.admin import default_replication
    from streamsched.ops.mirror import MirrorMaker, MirrorPlan

    source = source_connection(args)
    assert source is not None
    replication = args.replication or default_replication(asyncio.run(_brokers(target)))
    from streamsched.ops.dr import ensure_checkpoints_topic

    options = dict(_pair(o) for o in args.mirror_option)
    plan = MirrorPlan(source, target, tuple(s.name for s in specs), tuple(groups), replication=replication,
                      source_alias=args.source_alias, target_alias=args.target_alias, options=options)

    async def run() -> int:
        stop = stop_on_signals()
        await ensure_checkpoints_topic(target, plan.checkpoints_topic, replication)
        mm = MirrorMaker(plan, Path(args.workdir)).start()
        print(f"MirrorMaker {mm.version} mirrors {len(plan.topics)} topic(s) and {len(groups)} group(s); "
              f"logs in {args.workdir}", file=sys.stderr)
        try:
            while mm.running and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            await asyncio.to_thread(mm.stop)
        code = mm.proc.returncode if mm.proc is not None else 0
        return 0 if stop.is_set() else (code or 1)

    return asyncio.run(run())


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--mirror-option takes KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


async def _brokers(conn: Connection) -> int:
    from streamsched.kafka import clients

    admin = clients.admin(conn)
    await admin.start()
    try:
        return len((await admin.describe_cluster()).get("brokers") or ()) or 1
    finally:
        await admin.close()


def _status_table(status: Any) -> str:
    from streamsched.ops.dr import MirrorStatus

    assert isinstance(status, MirrorStatus)
    lines = []
    if not status.source_reachable:
        lines.append("the primary cluster did not answer: showing this cluster's side only")
    else:
        at_least = "" if all(p.exact for p in status.partitions) else "at least "
        lines.append(f"behind: {at_least}{status.behind} record(s), oldest {status.behind_s:.1f}s old; "
                     f"outcomes not mirrored: {at_least}{status.outcomes_not_mirrored}")
    for p in status.partitions:
        behind = "?" if p.behind is None else f"{p.behind}{'' if p.exact else '~'}"
        age = "-" if p.behind_s is None else f"{p.behind_s:.1f}s"
        error = f"  unreadable on the primary ({p.error})" if p.error else ""
        lines.append(f"{p.topic}[{p.partition}]  mirrored_end={p.mirrored_end}  behind={behind}  oldest={age}"
                     f"  outcomes={p.outcomes}{error}")
    return "\n".join(lines)


def _move_line(m: Any) -> str:
    was = "none" if m.committed is None else str(m.committed)
    verb = "moved" if m.moved else ("kept (at or past the checkpoint)" if m.committed is not None
                                    and m.committed >= m.checkpoint else "would move (dry run)")
    return f"{m.group} {m.topic}[{m.partition}]: committed {was}, checkpoint {m.checkpoint}: {verb}"
