"""The operator commands: broker, topics, run, status, dlq, outbox, replay, inspect, redrive,
cancel, pause, console and acl. Each ``cmd_*`` takes the parsed arguments and returns the exit
code; imports are local so that ``streamsched --help`` stays fast and a command loads only what
it uses."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from streamsched.errors import ConfigError
from streamsched.ops.cli.common import (
    configure_logging,
    connect,
    load_app,
    run_service,
    serve_status,
    stop_on_signals,
)
from streamsched.ops.cli.output import show

# --- broker ---------------------------------------------------------------------------------------

def cmd_broker(args: argparse.Namespace) -> int:
    from streamsched.ops import broker

    data_dir = Path(args.data_dir)
    if args.action == "start":
        broker.kafka_version(args.kafka_version)  # a bad release is refused before anything is created
        st = broker.status(data_dir)
        if st.get("running"):
            print(st["bootstrap"])
            return 0
        from streamsched.ops.broker_security import BrokerSecurity

        # A data dir formatted secured stays secured (its users exist only in its metadata).
        security = BrokerSecurity.load(data_dir / "security")
        if args.security == "sasl" or security is not None:
            security = BrokerSecurity.create(data_dir / "security", args.user or (), tls=args.tls)
        elif args.tls or args.user:
            raise ConfigError("--tls and --user need --security sasl")
        cluster = broker.LocalCluster(data_dir=data_dir, nodes=args.nodes, port=args.port, security=security,
                                      kafka_version=args.kafka_version)
        print(cluster.start())
        if security is not None:
            files = {u: str(security.write_client_file(cluster.bootstrap, u)) for u in security.users}
            print(json.dumps({"security": "sasl+tls" if security.tls else "sasl", "connection_files": files,
                              **({"tls_bootstrap": cluster.tls_bootstrap, "ca_file": str(security.ca_file)}
                                 if security.tls else {})}), file=sys.stderr)
        return 0
    if args.action == "stop":
        st = broker.status(data_dir)
        saved = data_dir / "cluster.json"
        if saved.exists():
            broker.stop_nodes([Path(node["data_dir"]) for node in json.loads(saved.read_text())["nodes"]])
        print("stopped" if st.get("running") else "not running")
        return 0
    st = broker.status(data_dir)
    show(args, st)
    return 0 if st.get("running") else 1


# --- topics ---------------------------------------------------------------------------------------

def cmd_topics(args: argparse.Namespace) -> int:
    from streamsched.kafka.admin import apply
    from streamsched.ops.cli.dr import scope, source_connection
    from streamsched.ops.dr import check_source

    bootstrap = connect(args)
    specs, _ = scope(args, bootstrap)  # every app is loaded before anything is applied
    source = source_connection(args)
    if source is not None:
        # A mirror's target: the primary must hold the same topics (partitions, settings) first.
        asyncio.run(check_source(source, specs))
    # Replication or min.insync.replicas other than the definition's is refused unless
    # --allow-drift (then reported); an internal RF 1 topic on a multi-broker cluster needs
    # --allow-single-replica (streamsched.kafka.admin).
    checks = {"allow_drift": args.allow_drift, "allow_single_replica": args.allow_single_replica}
    # One apply: one admin client, and any refusal comes before anything is created.
    report = asyncio.run(apply(bootstrap, specs, **checks))
    show(args, report.to_dict())
    return 0


# --- run ------------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from streamsched.ops import memtrace
    from streamsched.worker.intake import Worker, worker_config_from_env

    app = load_app(args.app)
    selected = app.select(args.scheduler)
    # --no-create-topics: a least-authority role has no CREATE; its topics are an operator's job.
    # --store-dir / --outcome-horizon: unset leaves the environment's (or the default) in force.
    store = {k: v for k, v in (("store_dir", args.store_dir), ("outcome_horizon_s", args.outcome_horizon),
                               ("instance_id", args.instance_id)) if v is not None}
    config = worker_config_from_env(connect(args), default_store=True,
                                    ensure_topics=not args.no_create_topics, replication=args.replication,
                                    allow_single_replica=args.allow_single_replica, **store)

    async def main() -> None:
        stop = stop_on_signals()
        workers = [Worker(sched, config) for sched in selected]
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(memtrace.snapshots_on_signal())
            # Ready when every scheduler's worker is.
            await serve_status(stack, args, [w.metrics for w in workers],
                                lambda: all(w.ready for w in workers))
            async with asyncio.TaskGroup() as tg:
                for w in workers:
                    tg.create_task(w.run(stop))
        for w in workers:
            print(json.dumps(w.metrics.snapshot()), file=sys.stderr)

    configure_logging()
    return run_service(main)


# --- status ---------------------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    from streamsched.ops.status import StatusUnavailable, fetch_status, format_status

    try:
        doc = asyncio.run(fetch_status(args.url_arg or args.url))
    except StatusUnavailable as exc:
        print(f"streamsched: {exc}", file=sys.stderr)
        return 1
    show(args, doc, format_status)
    return 0


# --- dlq ------------------------------------------------------------------------------------------

def cmd_dlq(args: argparse.Namespace) -> int:
    from streamsched.model.names import internal_topic
    from streamsched.ops.dlq import format_dead_letters, list_dead_letters, replay

    topic = args.topic or internal_topic("dlq", args.scheduler)
    bootstrap = connect(args)
    if args.action == "list":
        views = asyncio.run(list_dead_letters(bootstrap, topic, limit=args.limit, kind=args.kind,
                                              oldest=args.oldest))
        safe = [v.safe_dict() for v in views]
        show(args, safe, lambda _: format_dead_letters(views))  # never the original bytes or key
        return 0
    kinds = {args.kind} if args.kind else None
    if args.redrive:
        # The re-drive requests carry the originals themselves: each owner reopens and runs its
        # identity in one transaction. Replaying the originals to the transition topic as well
        # would race the requests (a copy applied first moves the identity's revision, and the
        # request is then refused), so dead letters are not replayed here; those without an
        # identity (decode, misrouted) are replayed by a plain `dlq replay`.
        from streamsched.ops import redrive

        if not args.app:
            raise ConfigError("dlq replay --redrive needs --app MODULE:ATTR "
                              "(identities come from the scheduler)")
        sched = load_app(args.app).one(args.scheduler)

        async def reopen() -> dict[str, Any]:
            targets = await redrive.targets_from_dlq(bootstrap, sched, kind=args.kind, limit=args.limit)
            done = await redrive.redrive(bootstrap, sched, targets, reason=args.reason, dry_run=args.dry_run)
            return done.to_dict()

        show(args, {"redrive": asyncio.run(reopen())})
        return 0
    if args.app or args.reason:
        raise ConfigError("--app and --reason apply to dlq replay --redrive only")
    report = asyncio.run(replay(bootstrap, topic, kinds=kinds, limit=args.limit, dry_run=args.dry_run))
    show(args, report.to_dict())
    return 0


# --- outbox ---------------------------------------------------------------------------------------

def cmd_outbox(args: argparse.Namespace) -> int:
    """``relay``: publish an outbox table's intents to Kafka until SIGTERM; ``status``: its counts;
    ``requeue``: give dead intents (of ``--kind``) a fresh set of attempts."""
    import socket

    from streamsched.model.retry import RetryPolicy
    from streamsched.outbox import Outbox

    if not args.dsn:
        raise ConfigError("outbox needs --dsn (sqlite:///path.db or postgresql://...) "
                          "or STREAMSCHED_OUTBOX_DSN")
    relay = {"lease_s": args.lease, "batch_size": args.batch_size, "keep_delivered_s": args.keep_delivered,
             "policy": RetryPolicy(maximum_attempts=args.max_attempts)} if args.action == "relay" else {}
    outbox = Outbox(args.dsn, table=args.table, **relay)
    if args.action in ("status", "requeue", "resend"):
        since_ns = since_time_ns(args.since) if args.action == "resend" else 0

        async def once() -> Any:
            async with outbox:
                if args.action == "requeue":
                    return {"requeued": await outbox.requeue_dead(args.kind)}
                if args.action == "resend":
                    done = await outbox.resend(since_ns, topic=args.topic)
                    if done.oldest_kept_ns is not None and done.oldest_kept_ns > since_ns:
                        print("streamsched: warning: the oldest delivery still kept is after --since: "
                              "intents delivered before it, if any, are no longer kept (a longer "
                              "--keep-delivered window keeps them)", file=sys.stderr)
                    return {"resent": done.resent, "since_ns": since_ns,
                            "oldest_kept_ns": done.oldest_kept_ns}
                return (await outbox.counts()).as_dict() | {"kept": await outbox.kept_count()}

        show(args, asyncio.run(once()))
        return 0
    from streamsched.kafka.admin import load_dir

    topics = load_dir(Path(args.dir))  # each intent is published in its topic's wire format
    bootstrap = connect(args)
    worker_id = args.worker_id or f"relay-{socket.gethostname()}-{os.getpid()}"

    async def main() -> None:
        stop = stop_on_signals()
        async with outbox, contextlib.AsyncExitStack() as stack:
            if args.create_schema:
                await outbox.ensure_schema()
            await serve_status(stack, args, [outbox.metrics], lambda: True)
            await outbox.relay(worker_id, stop, kafka=bootstrap, topics=topics)
        print(json.dumps(outbox.metrics.snapshot()), file=sys.stderr)

    configure_logging()
    return run_service(main)


def since_time_ns(text: str) -> int:
    """``--since``: an ISO 8601 time (UTC without an offset; replay's parser), or a duration
    before now (``5m``)."""
    import time

    from streamsched.model.durations import parse_duration
    from streamsched.ops.replay import parse_time

    try:
        return time.time_ns() - int(parse_duration(text) * 1e9)
    except (ConfigError, ValueError):
        pass
    try:
        return parse_time(text) * 1_000_000
    except ConfigError:
        raise ConfigError(f"--since expects an ISO 8601 time such as 2026-01-31T12:00:00Z or a duration "
                          f"such as 15m, got {text!r}") from None


# --- replay ---------------------------------------------------------------------------------------

def cmd_replay(args: argparse.Namespace) -> int:
    """Reset the scheduler group's offsets so its topic is read again (refused while the group has
    members), or ``--verify``: re-read the range and report what a replay would execute."""
    from streamsched.ops import replay, replay_verify

    sched = load_app(args.app).one(args.scheduler)
    target = replay.parse_target(earliest=args.to_earliest, offsets=args.to_offset, at=args.to_time)
    bootstrap = connect(args)
    if args.verify:
        report = asyncio.run(replay_verify.verify(bootstrap, sched, target, progress=args.progress))
        if args.per_identity:
            for entry in report.identities.values():
                print(json.dumps(entry.as_dict()))
        show(args, report.to_dict())
        return 0
    plan = asyncio.run(replay.reset(bootstrap, sched.group, sched.topic, target, dry_run=args.dry_run))
    for line in plan.lines():
        print(line, file=sys.stderr)
    show(args, plan.to_dict())
    return 0


# --- inspect --------------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace) -> int:
    """One identity's claim as its owner would see it now (safe fields only)."""
    from streamsched.ops.cli.events import event_arg
    from streamsched.ops.inspect import format_view, inspect_identity

    sched = load_app(args.app).one(args.scheduler)
    event = event_arg(args.event) if args.event is not None else None
    bootstrap = connect(args)
    view = asyncio.run(inspect_identity(bootstrap, sched, event=event, identity=args.identity,
                                        progress=args.progress))
    show(args, view.to_dict(), lambda _: format_view(view))
    return 0


# --- redrive --------------------------------------------------------------------------------------

def cmd_redrive(args: argparse.Namespace) -> int:
    """Reopen stored outcomes through their owners (see :mod:`streamsched.ops.redrive`)."""
    from streamsched.ops import redrive
    from streamsched.ops.replay import parse_time

    sched = load_app(args.app).one(args.scheduler)
    for flag in ("kind", "since"):
        if getattr(args, flag) is not None and not args.from_dlq:
            raise ConfigError(f"--{flag} applies to --from-dlq only")
    since = parse_time(args.since) if args.since is not None else None
    targets: list[redrive.Target] = []
    if args.identity is not None:
        targets.append(redrive.Target(args.identity))
    elif args.event is not None:
        from streamsched.ops.cli.events import event_arg
        from streamsched.ops.inspect import identity_of

        event = event_arg(args.event)
        targets.append(redrive.Target(identity_of(sched, event), event))
    bootstrap = connect(args)

    async def run() -> redrive.RedriveReport:
        chosen = targets or await redrive.targets_from_dlq(bootstrap, sched, kind=args.kind, since_ns=since)
        return await redrive.redrive(bootstrap, sched, chosen, reason=args.reason, force=args.force,
                                     dry_run=args.dry_run, progress=args.progress)

    show(args, asyncio.run(run()).to_dict())
    return 0


# --- cancel ---------------------------------------------------------------------------------------

def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel waiting work through its owner (see :mod:`streamsched.ops.cancel`)."""
    from streamsched.ops import cancel
    from streamsched.ops.redrive import Target

    sched = load_app(args.app).one(args.scheduler)
    if args.event is not None:
        from streamsched.ops.cli.events import event_arg
        from streamsched.ops.inspect import identity_of

        event = event_arg(args.event)
        target = Target(identity_of(sched, event), event)  # the event says where the identity lives
    else:
        target = Target(args.identity)
    bootstrap = connect(args)
    report = asyncio.run(cancel.cancel(bootstrap, sched, [target], reason=args.reason, dry_run=args.dry_run,
                                       progress=args.progress))
    show(args, report.to_dict())
    return 0


# --- pause / resume -------------------------------------------------------------------------------

def cmd_pause(args: argparse.Namespace) -> int:
    """Pause or resume a scheduler (see :mod:`streamsched.ops.pause`)."""
    from streamsched.ops.pause import request_pause

    name = args.scheduler_name or args.scheduler
    if args.scheduler_name and args.scheduler and args.scheduler_name != args.scheduler:
        raise ConfigError("name the scheduler once: SCHEDULER or --scheduler")
    if args.app is not None:
        name = load_app(args.app).one(name).name  # a name the app does not declare: ConfigError
    if name is None:
        raise ConfigError("which scheduler? name it: SCHEDULER, --scheduler NAME or --app MODULE:ATTR")
    bootstrap = connect(args)
    record = asyncio.run(request_pause(bootstrap, name, paused=args.paused, reason=args.reason))
    show(args, {"scheduler": name, **record.to_dict()})
    return 0


# --- acl ------------------------------------------------------------------------------------------

def cmd_acl(args: argparse.Namespace) -> int:
    """``plan``: the exact ACLs of a scheduler, ticker or producer role; ``apply``: create them."""
    from streamsched.ops.acl import run_acl

    return run_acl(args)


# --- console --------------------------------------------------------------------------------------

def cmd_console(args: argparse.Namespace) -> int:
    """Serve the web console until SIGTERM/SIGINT (see :mod:`streamsched.ops.console`)."""
    import logging

    from streamsched.ops.console import Console, ConsoleConfig, load_tokens

    if not 0 < args.sample_interval <= 3600:
        raise ConfigError("--sample-interval must be in (0, 3600] seconds")
    schedulers = [s for ref in args.app or () for s in load_app(ref).schedulers.values()]
    catalogs = list(dict.fromkeys(args.catalog or ()))
    for name in catalogs:
        from streamsched.model.names import validate_name

        validate_name(name, "catalog")
    tokens = load_tokens(args.token_file) if args.allow_actions else ()
    config = ConsoleConfig(connect(args), schedulers, catalogs, allow_actions=args.allow_actions,
                           tokens=tokens, host=args.host, port=args.port,
                           sample_interval_s=args.sample_interval, workers=args.worker or ())

    async def main() -> None:
        stop = stop_on_signals()
        async with Console(config) as console:
            print(json.dumps({"console_url": console.url, "actions": config.allow_actions}),
                  file=sys.stderr, flush=True)
            await stop.wait()

    configure_logging()
    logging.getLogger("streamsched.console").setLevel(logging.INFO)  # every action, with its principal
    return run_service(main)
