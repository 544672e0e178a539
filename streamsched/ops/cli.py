"""``streamsched`` command line: broker, topics, run, emit, status, dlq, schedule, outbox, replay, acl.

Every failure is one line on stderr with a documented exit code (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from streamsched.errors import ConfigError, StreamschedError

DEFAULT_DATA_DIR = Path(".streamsched/broker")
_early_stop: list[int] = []
"""Signals received before a worker's event loop took them over (see main)."""


def resolve_bootstrap(arg: str | None) -> str:
    """--bootstrap, then STREAMSCHED_BOOTSTRAP, then the local broker started by this project."""
    if arg:
        return arg
    env = os.environ.get("STREAMSCHED_BOOTSTRAP")
    if env:
        return env
    state = DEFAULT_DATA_DIR / "cluster.json"
    if state.exists():
        return str(json.loads(state.read_text())["bootstrap"])
    raise ConfigError("no Kafka to talk to: pass --bootstrap, set STREAMSCHED_BOOTSTRAP, "
                      "or run `streamsched broker start`")


def connect(args: argparse.Namespace) -> Any:
    """The command's :class:`~streamsched.kafka.clients.Connection` from its connection flags,
    STREAMSCHED_* variables and --config file (:mod:`streamsched.ops.config`). Typed ``Any``
    because some APIs still annotate a ``bootstrap: str`` although every one hands it to
    :func:`streamsched.kafka.clients.connection`, which takes both."""
    from streamsched.ops.config import resolve_connection

    return resolve_connection(args)


def load_app(ref: str) -> Any:
    """The app ``MODULE:ATTR`` names (the working directory is importable), or a one-line
    :class:`ConfigError` saying what is wrong with the reference: never an import traceback."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ConfigError(f"expected MODULE:ATTR, got {ref!r}")
    sys.path.insert(0, os.getcwd())
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise ConfigError(f"{ref}: no module named {exc.name!r} (not on PYTHONPATH nor in the "
                              "working directory)") from None
        raise ConfigError(f"{ref}: importing {module} failed: no module named {exc.name!r}") from None
    except Exception as exc:
        # The type (and where, for a syntax error), not the message: it is the app's own text.
        where = f" at {exc.filename}:{exc.lineno}" if isinstance(exc, SyntaxError) else ""
        raise ConfigError(f"{ref}: importing {module} failed: {type(exc).__name__}{where}") from exc
    if not hasattr(loaded, attr):
        raise ConfigError(f"{ref}: module {module} has no attribute {attr!r}")
    app = getattr(loaded, attr)
    if not hasattr(app, "schedulers"):
        raise ConfigError(f"{ref} is a {type(app).__name__}, not a streamsched.App")
    return app


# --- broker ---------------------------------------------------------------------------------------

def cmd_broker(args: argparse.Namespace) -> int:
    from streamsched.ops import broker

    data_dir = Path(args.data_dir)
    if args.action == "start":
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
        cluster = broker.LocalCluster(data_dir=data_dir, nodes=args.nodes, port=args.port, security=security)
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
            for node in json.loads(saved.read_text())["nodes"]:
                broker.stop_pid_file(Path(node["data_dir"]) / "pid")
        print("stopped" if st.get("running") else "not running")
        return 0
    st = broker.status(data_dir)
    print(json.dumps(st, indent=2))
    return 0 if st.get("running") else 1


# --- topics ---------------------------------------------------------------------------------------

def cmd_topics(args: argparse.Namespace) -> int:
    from streamsched.kafka.admin import TopicSpec, apply, load_dir

    specs = load_dir(Path(args.dir))
    if args.replication:
        specs = [s.with_replication(args.replication) for s in specs]
    derived: list[TopicSpec] = []  # every app is loaded before anything is applied
    by_name = {s.name: s for s in specs}
    for ref in args.app or ():
        for sched in load_app(ref).schedulers.values():
            base = by_name.get(sched.topic)
            if base is None:
                raise ConfigError(f"scheduler {sched.name}: topic {sched.topic} is not defined")
            derived.append(TopicSpec(sched.state_topic, base.partitions, base.replication, "state"))
            derived.append(TopicSpec(sched.dead_letter_topic, base.partitions, base.replication,
                                     "dead_letter"))
            derived.append(TopicSpec(sched.delay_topic, base.partitions, base.replication, "delay"))
    bootstrap = connect(args)
    # Replication or min.insync.replicas other than the definition's is refused unless
    # --allow-drift (then reported); an internal RF 1 topic on a multi-broker cluster needs
    # --allow-single-replica (streamsched.kafka.admin).
    checks = {"allow_drift": args.allow_drift, "allow_single_replica": args.allow_single_replica}
    report = asyncio.run(apply(bootstrap, specs, **checks))
    if derived:
        report.merge(asyncio.run(apply(bootstrap, derived, **checks)))
    print(json.dumps(report.to_dict()))
    return 0


# --- run ------------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from streamsched.worker.intake import Worker, worker_config_from_env

    app = load_app(args.app)
    names = [args.scheduler] if args.scheduler else list(app.schedulers)
    unknown = [n for n in names if n not in app.schedulers]
    if unknown:
        raise ConfigError(f"no scheduler named {unknown[0]!r} in {args.app}")
    # --no-create-topics: a least-authority role has no CREATE; its topics are an operator's job.
    # --store-dir / --outcome-horizon: unset leaves the environment's (or the default) in force.
    store = {k: v for k, v in (("store_dir", args.store_dir), ("outcome_horizon_s", args.outcome_horizon))
             if v is not None}
    config = worker_config_from_env(connect(args), ensure_topics=not args.no_create_topics,
                                    replication=args.replication,
                                    allow_single_replica=args.allow_single_replica, **store)

    async def main() -> None:
        stop = _stop_on_signals()
        workers = [Worker(app.schedulers[n], config) for n in names]
        async with contextlib.AsyncExitStack() as stack:
            # Ready when every scheduler's worker is (getattr: `ready` is new on Worker).
            await _serve_status(stack, args, [w.metrics for w in workers],
                                lambda: all(getattr(w, "ready", False) is True for w in workers))
            async with asyncio.TaskGroup() as tg:
                for w in workers:
                    tg.create_task(w.run(stop))
        for w in workers:
            print(json.dumps(w.metrics.snapshot()), file=sys.stderr)

    _configure_logging()
    return _run_service(main)


def _stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGTERM/SIGINT (drain, commit, leave the group); a second one
    cancels the running main task: stop at once, without draining. Signals that arrived while
    the process was starting (see :func:`_early_signal`) count."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

    def on_signal(signum: int) -> None:
        _early_stop.append(signum)
        if len(_early_stop) == 1:
            stop.set()
        elif main_task is not None:
            main_task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    if _early_stop:
        stop.set()
        if len(_early_stop) > 1 and main_task is not None:
            main_task.cancel()
    return stop


def _early_signal(signum: int, _frame: object) -> None:
    """SIGTERM/SIGINT before the event loop took them over (or after it closed): the first one
    means "stop cleanly" (no KeyboardInterrupt traceback), a second one exits at once."""
    _early_stop.append(signum)
    if len(_early_stop) > 1:
        raise SystemExit(128 + signum)


def _run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> int:
    """``asyncio.run(main())`` for a worker or ticker whose ``main`` uses :func:`_stop_on_signals`:
    0 after a clean drain, 128 + the signal number when a second signal stopped it at once."""
    early = signal.getsignal(signal.SIGINT) is _early_signal  # started through main()
    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        return 128 + (_early_stop[-1] if _early_stop else signal.SIGTERM)
    finally:
        if early:  # asyncio restored the defaults when its loop closed: a late signal stays quiet
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, _early_signal)
    return 0


def _configure_logging() -> None:
    logging.basicConfig(level=os.environ.get("STREAMSCHED_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


# --- status ---------------------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    from streamsched.ops.status import StatusUnavailable, fetch_status, format_status

    try:
        doc = asyncio.run(fetch_status(args.url_arg or args.url))
    except StatusUnavailable as exc:
        print(f"streamsched: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0


async def _serve_status(stack: contextlib.AsyncExitStack, args: argparse.Namespace, metrics: list[Any],
                        ready: Any) -> None:
    """Serve /metrics, /status, /healthz and /readyz on --status-host:--status-port until ``stack`` closes."""
    if args.status_port is None:
        return
    from streamsched.ops.status import StatusServer

    server = await stack.enter_async_context(
        StatusServer(metrics, host=args.status_host, port=args.status_port, ready=ready))
    print(json.dumps({"status_url": server.url}), file=sys.stderr, flush=True)


def _add_status_options(p: argparse.ArgumentParser, *, port_from_env: bool) -> None:
    # Only `run` reads STREAMSCHED_STATUS_PORT: a worker and a ticker started from one
    # environment must not both try to bind it.
    env_port = os.environ.get("STREAMSCHED_STATUS_PORT") if port_from_env else None
    p.add_argument("--status-port", type=int, default=int(env_port) if env_port else None,
                   help="serve /status (JSON), /metrics (Prometheus), /healthz and /readyz on this port"
                        + (" (env STREAMSCHED_STATUS_PORT)" if port_from_env else "") + "; default: none")
    p.add_argument("--status-host", default=os.environ.get("STREAMSCHED_STATUS_HOST", "127.0.0.1"),
                   help="address the status server binds (env STREAMSCHED_STATUS_HOST; default 127.0.0.1, "
                        "0.0.0.0 in a container)")


# --- dlq ------------------------------------------------------------------------------------------

def cmd_dlq(args: argparse.Namespace) -> int:
    from streamsched.model.names import internal_topic
    from streamsched.ops.dlq import format_dead_letters, list_dead_letters, replay

    topic = args.topic or internal_topic("dlq", args.scheduler)
    bootstrap = connect(args)
    if args.action == "list":
        views = asyncio.run(list_dead_letters(bootstrap, topic, limit=args.limit, kind=args.kind))
        print(format_dead_letters(views))
        return 0
    kinds = {args.kind} if args.kind else None
    report = asyncio.run(replay(bootstrap, topic, kinds=kinds, limit=args.limit, dry_run=args.dry_run))
    print(json.dumps(report.to_dict()))
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
    outbox = Outbox(args.dsn, table=args.table, lease_s=args.lease_s, batch_size=args.batch_size,
                    policy=RetryPolicy(maximum_attempts=args.max_attempts))
    if args.action in ("status", "requeue"):
        async def once() -> Any:
            async with outbox:
                if args.action == "requeue":
                    return {"requeued": await outbox.requeue_dead(args.kind)}
                return (await outbox.counts()).as_dict()

        print(json.dumps(asyncio.run(once())))
        return 0
    bootstrap = connect(args)
    worker_id = args.worker_id or f"relay-{socket.gethostname()}-{os.getpid()}"

    async def main() -> None:
        stop = _stop_on_signals()
        async with outbox, contextlib.AsyncExitStack() as stack:
            if args.create_schema:
                await outbox.ensure_schema()
            await _serve_status(stack, args, [outbox.metrics], lambda: True)
            await outbox.relay(worker_id, stop, kafka=bootstrap)
        print(json.dumps(outbox.metrics.snapshot()), file=sys.stderr)

    _configure_logging()
    return _run_service(main)


# --- replay ---------------------------------------------------------------------------------------

def cmd_replay(args: argparse.Namespace) -> int:
    """Reset the scheduler group's offsets so its topic is read again (refused while the group has
    members), or ``--verify``: re-read the range and report what a replay would execute."""
    from streamsched.ops import replay, replay_verify

    sched = replay.pick_scheduler(load_app(args.app), args.scheduler, args.app)
    target = replay.parse_target(earliest=args.to_earliest, offsets=args.to_offset, at=args.to_time)
    bootstrap = connect(args)
    if args.verify:
        report = asyncio.run(replay_verify.verify(bootstrap, sched, target, progress=args.progress))
        if args.per_identity:
            for entry in report.identities.values():
                print(json.dumps(entry.as_dict()))
        print(json.dumps(report.to_dict()))
        return 0
    plan = asyncio.run(replay.reset(bootstrap, sched.group, sched.topic, target, dry_run=args.dry_run))
    for line in plan.lines():
        print(line, file=sys.stderr)
    print(json.dumps(plan.to_dict()))
    return 0


# --- acl ------------------------------------------------------------------------------------------

def cmd_acl(args: argparse.Namespace) -> int:
    """``plan``: the exact ACLs of an app's scheduler roles; ``apply``: create them (as an operator)."""
    from streamsched.ops import acl

    acls = acl.plan_app(load_app(args.app), principal=args.principal, scheduler=args.scheduler,
                        catalogs=args.catalog or ())
    if args.action == "plan":
        print(acl.format_plan(acls, as_json=args.format == "json"))
        return 0
    applied = asyncio.run(acl.apply(connect(args), acls))
    print(json.dumps({"applied": applied, "principals": sorted({a.principal for a in acls})}))
    return 0


# --- emit -----------------------------------------------------------------------------------------

def event_from_json(doc: dict[str, Any]) -> Any:
    """Build a validated TransitionEvent from the CLI's JSON shape."""
    from streamsched.model.event import TransitionEvent
    from streamsched.model.jsonval import json_dumps
    from streamsched.wire.transition import decode_transition, encode_transition

    allowed = {"type", "tenant", "target", "due_ns", "payload", "event_id", "attempt", "origin"}
    extra = set(doc) - allowed
    if extra:
        raise ConfigError(f"unknown event fields {sorted(extra)}; allowed: {sorted(allowed)}")
    if "type" not in doc:
        raise ConfigError("an event needs a 'type'")
    target = doc.get("target", [])
    if isinstance(target, str):
        target = [target]
    ev = TransitionEvent(
        event_id=str(doc.get("event_id") or uuid.uuid4().hex),
        type=str(doc["type"]),
        tenant=str(doc.get("tenant", "")),
        target=tuple(str(t) for t in target),
        due_ns=int(doc.get("due_ns", 0)),
        payload=json_dumps(doc.get("payload", {})),
        produced_ns=time.time_ns(),
        attempt=int(doc.get("attempt", 1)),
        origin=doc.get("origin"),
    )
    # Round-trip through the decoder: `emit` refuses anything a worker would dead-letter.
    return decode_transition(encode_transition(ev))


def cmd_emit(args: argparse.Namespace) -> int:
    from streamsched.kafka.producer import Producer, encode_event
    from streamsched.model.names import validate_name

    validate_name(args.topic, "topic")
    try:
        doc = json.loads(args.event)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--event is not valid JSON (line {exc.lineno} col {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ConfigError("--event must be a JSON object")
    ev = event_from_json(doc)
    key, _ = encode_event(ev)
    if args.key and args.key.encode() != key:
        # Any other key puts the identity on a partition its owner never sees (dead-lettered).
        raise ConfigError("--key must be the event's route key (omit it: emit sets the route key)")
    bootstrap = connect(args)

    async def send() -> Any:
        async with Producer(bootstrap) as producer:
            return await producer.send(args.topic, ev)

    md = asyncio.run(send())
    print(json.dumps({"topic": md.topic, "partition": md.partition, "offset": md.offset,
                      "event_id": ev.event_id}))
    return 0


# --- schedule -------------------------------------------------------------------------------------

def _fmt_ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cmd_schedule(args: argparse.Namespace) -> int:
    from streamsched.schedules.catalog import Catalog

    catalog = Catalog(connect(args), args.catalog, partitions=args.partitions, replication=args.replication,
                      allow_single_replica=args.allow_single_replica)

    async def run() -> int:
        if args.action == "add":
            from streamsched.model.names import validate_name
            from streamsched.model.specs import parse_spec

            # Refuse bad input before touching the cluster.
            validate_name(args.name, "schedule")
            validate_name(args.target, "topic")
            parse_spec(args.spec, timezone=args.timezone)
            await catalog.ensure_topics()
            payload = json.loads(args.payload) if args.payload else None
            d = await catalog.schedule(args.name, args.spec, args.target, payload,
                                       event_type=args.type, tenant=args.tenant,
                                       policy=args.policy, timezone=args.timezone)
            print(json.dumps({"name": d.name, "version": d.version, "schedule_id": d.schedule_id}))
            return 0
        if args.action in ("rm", "enable", "disable"):
            fn = {"rm": catalog.unschedule, "enable": catalog.enable, "disable": catalog.disable}
            found = await fn[args.action](args.name)
            print(json.dumps({"name": args.name, args.action: found}))
            return 0 if found else 1
        if args.action == "list":
            infos = await catalog.list()
            if infos.skipped_corrupt:
                print(f"{infos.skipped_corrupt} unreadable records skipped", file=sys.stderr)
            if args.json:
                print(json.dumps([i.as_dict() for i in infos]))
                return 0
            print(f"{'name':<24} {'spec':<20} {'status':<10} {'next planned (UTC)':<28} fired skipped")
            for i in infos:
                row = i.as_dict()
                print(f"{row['name']:<24} {row['spec']:<20} {row['status']:<10} "
                      f"{_fmt_ns(row['next_planned_ns']):<28} {row['fired']:>5} {row['skipped']:>7}")
            return 0
        if args.action == "history":
            rows = await catalog.history(args.name)
            if rows.skipped_corrupt:
                print(f"{rows.skipped_corrupt} unreadable records skipped", file=sys.stderr)
            for r in rows:
                cause = f" {r.cause_kind}/{r.cause_category}" if r.cause_kind else ""
                print(f"{_fmt_ns(r.at_ns)}  {r.occurrence:<40} attempt {r.attempt}  {r.state}{cause}")
            return 0
        raise ConfigError(f"unknown schedule action {args.action}")

    if args.action == "tick":
        return _run_ticker(catalog, args)
    return asyncio.run(run())


def _run_ticker(catalog: Any, args: argparse.Namespace) -> int:
    from streamsched.schedules.ticker import Ticker, TickerConfig
    from streamsched.worker.intake import worker_config_from_env

    wc = worker_config_from_env(catalog.bootstrap)
    config = TickerConfig(bootstrap=catalog.bootstrap, owner=wc.owner,
                          session_timeout_ms=wc.session_timeout_ms,
                          heartbeat_interval_ms=wc.heartbeat_interval_ms)

    async def main() -> None:
        stop = _stop_on_signals()
        ticker = Ticker(catalog, config)
        async with contextlib.AsyncExitStack() as stack:
            # getattr: `ready` is new on Ticker; until it exists the ticker reports not ready.
            await _serve_status(stack, args, [ticker.metrics],
                                lambda: getattr(ticker, "ready", False) is True)
            await ticker.run(stop)
        print(json.dumps(ticker.metrics.snapshot()), file=sys.stderr)

    _configure_logging()
    return _run_service(main)


_SCHEDULE_EPILOG = """\
missed boundaries (--policy), after downtime:
  The missed boundaries are those after the last one planned, up to and including now; say D.
  catch_up  fires the first 64 in order, then the latest (the current occurrence):
            D <= 65: all D fire, none skipped; D > 65: 65 fire, the D - 65 between the
            64th and the latest are skipped.
  coalesce  fires only the latest; D - 1 are skipped.
  Skipped boundaries never fire and get no history row; `schedule list` counts them.
  Example, D = 100: catch_up fires the 1st-64th and the 100th, skips 35;
  coalesce fires the 100th, skips 99. One run fires at most 65 occurrences per schedule.

list/history print "N unreadable records skipped" on stderr when the catalog holds records
they cannot decode.
"""


_RUN_EPILOG = """\
environment (besides the flags' own):
  STREAMSCHED_SESSION_TIMEOUT_MS  consumer-group session timeout (default 10000)
  STREAMSCHED_HEARTBEAT_MS        heartbeat interval (default 1000)
  STREAMSCHED_COMMIT_INTERVAL_S   longest wait before offsets ride a transaction under load (0.2)
  STREAMSCHED_LOG                 log level (default WARNING; DEBUG also prints tracebacks)

The first SIGTERM or SIGINT drains, commits and leaves the group (exit 0); a second stops at once.
"""


def _horizon(text: str) -> float:
    from streamsched.worker.store import check_horizon, parse_duration

    try:
        return check_horizon(parse_duration(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def version_text() -> str:
    """``streamsched X.Y.Z (aiokafka A.B.C, Python P)``: what a bug report needs."""
    import platform
    from importlib import metadata

    import streamsched

    def installed(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    ours = installed("streamsched") or streamsched.__version__
    return f"streamsched {ours} (aiokafka {installed('aiokafka') or '?'}, Python {platform.python_version()})"


def _add_single_replica_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-single-replica", action="store_true",
                   help="allow creating internal topics with replication factor 1 on a multi-broker cluster "
                        "(default: refused; their records would be lost with one broker)")


def build_parser() -> argparse.ArgumentParser:
    from streamsched.ops.config import add_connection_options

    parser = argparse.ArgumentParser(
        prog="streamsched", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description="Durable workflow schedulers on Apache Kafka. `streamsched COMMAND --help` tells "
                    "each command's flags (and the STREAMSCHED_* variable each one reads).")
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print streamsched's version (and aiokafka's, Python's) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("broker", help="run a local Apache Kafka (KRaft) on loopback")
    b.add_argument("action", choices=["start", "stop", "status"], help="start, stop or show the local broker")
    b.add_argument("--port", type=int, default=None, help="client port of the first node (default: free)")
    b.add_argument("--nodes", type=int, default=1, help="brokers in the local cluster (default 1)")
    b.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR),
                   help=f"where the cluster keeps its logs and state (default {DEFAULT_DATA_DIR})")
    b.add_argument("--security", choices=["none", "sasl"], default="none",
                   help="sasl: SASL_PLAINTEXT with SCRAM users, the StandardAuthorizer and super user admin "
                        "(connection files for --config are written under DATA_DIR/security)")
    b.add_argument("--tls", action="store_true",
                   help="with --security sasl: also SASL_SSL and client-certificate SSL listeners, with a "
                        "CA made for this broker (openssl)")
    b.add_argument("--user", action="append", default=None, metavar="NAME",
                   help="with --security sasl: a SCRAM user created at format time (repeatable)")
    b.set_defaults(fn=cmd_broker)

    t = sub.add_parser("topics", help="apply topic definitions idempotently")
    t.add_argument("action", choices=["apply"], help="create missing topics, verify existing ones")
    t.add_argument("--dir", default="topics", help="directory of *.toml topic definitions (default topics)")
    t.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                   help="an app whose schedulers' state, dead-letter and delay topics to apply too "
                        "(repeatable)")
    t.add_argument("--replication", type=int, default=None,
                   help="replication factor of every topic applied (default: each definition's, else "
                        "min(3, brokers); internal topics get min.insync.replicas min(2, replication))")
    t.add_argument("--allow-drift", action="store_true",
                   help="accept and report existing topics whose replication or min.insync.replicas differ "
                        "from the definition (default: refuse, exit 2)")
    _add_single_replica_option(t)
    add_connection_options(t)
    t.set_defaults(fn=cmd_topics)

    r = sub.add_parser("run", help="run an app's schedulers as consumer-group members",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_RUN_EPILOG)
    r.add_argument("app", help="MODULE:ATTR of a streamsched.App")
    r.add_argument("--scheduler", default=None, help="run only this scheduler of the app (default: all)")
    env_rf = os.environ.get("STREAMSCHED_REPLICATION")
    r.add_argument("--replication", type=int, default=int(env_rf) if env_rf else None,
                   help="replication factor of the state, dead-letter and delay topics the worker creates "
                        "(env STREAMSCHED_REPLICATION; default min(3, brokers), min.insync.replicas "
                        "min(2, replication)); an explicit one also refuses existing topics that differ")
    _add_single_replica_option(r)
    r.add_argument("--no-create-topics", action="store_true",
                   help="do not create the state, dead-letter and delay topics (a role without CREATE; "
                        "an operator runs `topics apply --app`)")
    r.add_argument("--store-dir", default=None,
                   help="keep claim state on disk here (RocksDB, one store per owned partition; a restart "
                        "reads only the state topic's tail; env STREAMSCHED_STORE_DIR; default: in memory)")
    r.add_argument("--outcome-horizon", default=None, type=_horizon, metavar="DURATION",
                   help="how long a resolved identity is remembered, e.g. 7d, 36h (1h..365d; env "
                        "STREAMSCHED_OUTCOME_HORIZON; default 7d); an event replayed later runs again")
    add_connection_options(r)
    _add_status_options(r, port_from_env=True)
    r.set_defaults(fn=cmd_run)

    dq = sub.add_parser("dlq", help="list dead letters, or replay them to their source topic")
    dq.add_argument("action", choices=["list", "replay"], help="list dead letters, or replay them")
    dq.add_argument("scheduler", nargs="?", default=None, help="scheduler whose dead-letter topic to use")
    dq.add_argument("--topic", default=None, help="a dead-letter topic by name instead")
    dq.add_argument("--kind", default=None, help="only this kind (decode, bound, misrouted, terminal, ...)")
    dq.add_argument("--limit", type=int, default=100, help="at most this many dead letters (default 100)")
    dq.add_argument("--dry-run", action="store_true", help="replay: count, send nothing")
    add_connection_options(dq)
    dq.set_defaults(fn=cmd_dlq)

    st = sub.add_parser("status", help="print a running worker's counters, gauges and last error")
    st.add_argument("url_arg", nargs="?", default=None, metavar="URL",
                    help="status server, e.g. http://127.0.0.1:9464 (same as --url)")
    st.add_argument("--url", default=os.environ.get("STREAMSCHED_STATUS_URL", "http://127.0.0.1:9464"),
                    help="status server (env STREAMSCHED_STATUS_URL; default http://127.0.0.1:9464)")
    st.add_argument("--json", action="store_true", help="machine output: the /status document as JSON")
    st.set_defaults(fn=cmd_status)

    e = sub.add_parser("emit", help="produce one schema-validated transition event")
    e.add_argument("topic", help="transition topic to produce to")
    e.add_argument("--event", required=True, metavar="JSON",
                   help='the event as a JSON object, e.g. {"type":"due","tenant":"t1","target":["run-1"]} '
                        "(emit always prints one JSON line)")
    e.add_argument("--key", default=None,
                   help="record key; must equal the identity's route key (the default), else refused")
    add_connection_options(e)
    e.set_defaults(fn=cmd_emit)

    sc = sub.add_parser("schedule", help="durable schedules: add, rm, enable, disable, list, history, tick",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_SCHEDULE_EPILOG)
    sc.add_argument("action", choices=["add", "rm", "enable", "disable", "list", "history", "tick"],
                    help="tick runs the ticker that fires due occurrences (a long-running service)")
    sc.add_argument("name", nargs="?", default=None, help="schedule name (add, rm, enable, disable, history)")
    sc.add_argument("spec", nargs="?", default=None, help="@every 5m | @at 2026-12-24T18:00:00Z | cron")
    sc.add_argument("--target", default=None, help="transition topic the occurrences go to")
    sc.add_argument("--payload", default=None, help="JSON document carried by every occurrence")
    sc.add_argument("--type", default="due", help="transition type of the occurrences")
    sc.add_argument("--tenant", default="", help="tenant of the occurrences (default empty)")
    sc.add_argument("--policy", choices=["catch_up", "coalesce"], default="catch_up",
                    help="what fires after downtime (see below; default catch_up)")
    sc.add_argument("--timezone", default=None, help="IANA zone for cron specs")
    sc.add_argument("--catalog", default="default", help="catalog name (default: default)")
    sc.add_argument("--partitions", type=int, default=4, help="partitions of a new catalog's topics")
    sc.add_argument("--replication", type=int, default=None,
                    help="replication factor of a new catalog's topics (default min(3, brokers), "
                         "min.insync.replicas min(2, replication)); an explicit one refuses topics "
                         "that differ")
    _add_single_replica_option(sc)
    sc.add_argument("--json", action="store_true", help="list: machine output (a JSON array)")
    add_connection_options(sc)
    _add_status_options(sc, port_from_env=False)  # used by `tick`
    sc.set_defaults(fn=cmd_schedule)

    ob = sub.add_parser("outbox", help="relay an outbox table's intents to Kafka; show or requeue them")
    ob.add_argument("action", choices=["relay", "status", "requeue"],
                    help="relay (a long-running service), status (counts) or requeue (dead intents)")
    ob.add_argument("--dsn", default=os.environ.get("STREAMSCHED_OUTBOX_DSN"),
                    help="sqlite:///path.db, sqlite:////abs/path.db or postgresql://... "
                         "(env STREAMSCHED_OUTBOX_DSN)")
    ob.add_argument("--table", default="streamsched_outbox", help="outbox table (default streamsched_outbox)")
    ob.add_argument("--worker-id", default=None, help="lease owner name (default relay-<host>-<pid>)")
    ob.add_argument("--batch-size", type=int, default=16, help="intents claimed per round (max 64)")
    ob.add_argument("--lease-s", type=float, default=30.0, help="lease: the longest one delivery may take")
    ob.add_argument("--max-attempts", type=int, default=5, help="deliveries before an intent is dead")
    ob.add_argument("--kind", default=None, help="requeue: only dead intents of this kind")
    ob.add_argument("--create-schema", action="store_true", help="relay: create the table if missing")
    add_connection_options(ob)
    _add_status_options(ob, port_from_env=False)
    ob.set_defaults(fn=cmd_outbox)

    rp = sub.add_parser("replay", help="re-run a scheduler over its topic from an offset or a time "
                        "(resets its group's offsets), or --verify that a replay runs nothing new")
    rp.add_argument("--app", required=True, help="MODULE:ATTR of a streamsched.App")
    rp.add_argument("--scheduler", default=None, help="scheduler name (optional if the app has one)")
    to = rp.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="from the first retained record")
    to.add_argument("--to-offset", default=None, metavar="P:O,...", help="from these offsets (clamped)")
    to.add_argument("--to-time", default=None, metavar="ISO8601",
                    help="from the first record at or after this time (no offset given: UTC)")
    rp.add_argument("--dry-run", action="store_true", help="show the reset, commit nothing")
    rp.add_argument("--verify", action="store_true",
                    help="read the range and report per identity whether a replay would execute "
                         "anything; never commits")
    rp.add_argument("--per-identity", action="store_true", help="--verify: one JSON line per identity")
    rp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="--verify: progress on stderr (default: on long ranges)")
    add_connection_options(rp)
    rp.set_defaults(fn=cmd_replay)

    ac = sub.add_parser("acl", help="print (plan) or create (apply) the least-authority Kafka ACLs "
                        "of an app's scheduler roles")
    ac.add_argument("action", choices=["plan", "apply"], help="plan: print the ACLs; apply: create them")
    ac.add_argument("--app", required=True, help="MODULE:ATTR of a streamsched.App")
    ac.add_argument("--scheduler", default=None, help="only this scheduler (default: every one)")
    ac.add_argument("--principal", default=None,
                    help="User:NAME the ACLs are for (default: User:<scheduler name>)")
    ac.add_argument("--catalog", action="append", default=None, metavar="NAME",
                    help="a schedule catalog whose occurrences the scheduler runs: may write its "
                         "feedback topic (repeatable)")
    ac.add_argument("--format", choices=["table", "json"], default="table", help="plan: output format")
    add_connection_options(ac)
    ac.set_defaults(fn=cmd_acl)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.fn is cmd_dlq and not (args.scheduler or args.topic):
        print("streamsched: dlq needs a scheduler name or --topic", file=sys.stderr)
        return 2
    if args.fn is cmd_schedule:
        needs = {"add": ("name", "spec", "target"), "rm": ("name",), "enable": ("name",),
                 "disable": ("name",), "history": ("name",)}.get(args.action, ())
        missing = [n for n in needs if getattr(args, n) is None]
        if missing:
            print(f"streamsched: schedule {args.action} needs {', '.join(missing)}", file=sys.stderr)
            return 2
    if args.fn is cmd_run or (args.fn is cmd_schedule and args.action == "tick"):
        # A SIGTERM or SIGINT that arrives while the worker is still importing must mean "stop
        # cleanly", not dying mid-start (or a KeyboardInterrupt traceback); a second one exits.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _early_signal)
    try:
        return int(args.fn(args))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        return report_failure(exc)


EXIT_CODES = """\
exit codes:
  0      success
  1      the answer is no: `broker status` of a stopped broker, `status` with no server
         answering, `schedule rm|enable|disable` of a schedule that does not exist
  2      usage or configuration error, or input refused (a bad flag, MODULE:ATTR, event,
         topic definition or drift): nothing was sent
  3      Kafka is unreachable or refused the request
  4      a worker, ticker or relay stopped on an unexpected error
  128+N  stopped at once by a second signal N (130: two Ctrl-C, 143: two SIGTERMs)
every failure is one line on stderr ("streamsched: ..."); STREAMSCHED_LOG=DEBUG adds the traceback
"""


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: `run` runs its workers in a TaskGroup."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def report_failure(exc: Exception) -> int:
    """Print ``exc`` as one line on stderr and return its exit code (:data:`EXIT_CODES`).

    An exception group is unwrapped: our own typed error wins, then Kafka's, then anything else.
    Kafka's and unexpected errors are named by type only: their messages can carry broker-side
    detail or record fragments we do not vouch for.
    """
    import socket

    from aiokafka.errors import KafkaError

    leaves = _leaves(exc)
    if os.environ.get("STREAMSCHED_LOG", "").upper() == "DEBUG":
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    ours = [e for e in leaves if isinstance(e, StreamschedError)]
    if ours:
        print(f"streamsched: {type(ours[0]).__name__}: {ours[0]}", file=sys.stderr)
        return 2
    unreachable = KafkaError | ConnectionError | TimeoutError | socket.gaierror
    kafka = [e for e in leaves if isinstance(e, unreachable)]
    if kafka:
        print(f"streamsched: Kafka is unreachable or refused the request ({type(kafka[0]).__name__})",
              file=sys.stderr)
        return 3
    files = [e for e in leaves if isinstance(e, OSError)]
    if files:
        err = files[0]
        print(f"streamsched: {type(err).__name__}: {err.strerror or 'failed'}"
              + (f": {err.filename}" if err.filename else ""), file=sys.stderr)
        return 2
    print(f"streamsched: stopped on an unexpected error ({type(leaves[0]).__name__}); "
          "STREAMSCHED_LOG=DEBUG prints the traceback", file=sys.stderr)
    return 4


if __name__ == "__main__":
    sys.exit(main())
