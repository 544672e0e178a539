"""``streamsched`` command line: broker, topics, run, emit."""

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
from pathlib import Path
from typing import Any

from streamsched.errors import ConfigError, StreamschedError
from streamsched.kafka import clients

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


def load_app(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ConfigError(f"expected MODULE:ATTR, got {ref!r}")
    sys.path.insert(0, os.getcwd())
    return getattr(importlib.import_module(module), attr)


# --- broker ---------------------------------------------------------------------------------------

def cmd_broker(args: argparse.Namespace) -> int:
    from streamsched.ops import broker

    data_dir = Path(args.data_dir)
    if args.action == "start":
        st = broker.status(data_dir)
        if st.get("running"):
            print(st["bootstrap"])
            return 0
        cluster = broker.LocalCluster(data_dir=data_dir, nodes=args.nodes, port=args.port)
        print(cluster.start())
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
    bootstrap = resolve_bootstrap(args.bootstrap)
    if args.replication:
        specs = [s.with_replication(args.replication) for s in specs]
    report = asyncio.run(apply(bootstrap, specs))
    if args.app:
        app = load_app(args.app)
        derived: list[TopicSpec] = []
        by_name = {s.name: s for s in specs}
        for sched in app.schedulers.values():
            base = by_name.get(sched.topic)
            if base is None:
                raise ConfigError(f"scheduler {sched.name}: topic {sched.topic} is not defined")
            derived.append(TopicSpec(sched.state_topic, base.partitions, base.replication, "state"))
            derived.append(TopicSpec(sched.dead_letter_topic, base.partitions, base.replication,
                                     "dead_letter"))
            derived.append(TopicSpec(sched.delay_topic, base.partitions, base.replication, "delay"))
        more = asyncio.run(apply(bootstrap, derived))
        report.created += more.created
        report.unchanged += more.unchanged
    print(json.dumps({"created": report.created, "unchanged": report.unchanged}))
    return 0


# --- run ------------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from streamsched.worker.intake import Worker, worker_config_from_env

    app = load_app(args.app)
    names = [args.scheduler] if args.scheduler else list(app.schedulers)
    unknown = [n for n in names if n not in app.schedulers]
    if unknown:
        raise ConfigError(f"no scheduler named {unknown[0]!r} in {args.app}")
    config = worker_config_from_env(resolve_bootstrap(args.bootstrap))

    async def main() -> None:
        stop = _stop_on_signals()
        workers = [Worker(app.schedulers[n], config) for n in names]
        async with contextlib.AsyncExitStack() as stack:
            if args.status_port is not None:
                from streamsched.ops.status import StatusServer

                server = await stack.enter_async_context(
                    StatusServer([w.metrics for w in workers], port=args.status_port))
                print(json.dumps({"status_url": server.url}), file=sys.stderr, flush=True)
            async with asyncio.TaskGroup() as tg:
                for w in workers:
                    tg.create_task(w.run(stop))
        for w in workers:
            print(json.dumps(w.metrics.snapshot()), file=sys.stderr)

    _configure_logging()
    asyncio.run(main())
    return 0


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM/SIGINT (or by one that arrived while the process was starting)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if _early_stop:
        stop.set()
    return stop


def _configure_logging() -> None:
    logging.basicConfig(level=os.environ.get("STREAMSCHED_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


# --- status ---------------------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    from streamsched.ops.status import StatusUnavailable, fetch_status, format_status

    try:
        doc = asyncio.run(fetch_status(args.url))
    except StatusUnavailable as exc:
        print(f"streamsched: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0


# --- dlq ------------------------------------------------------------------------------------------

def cmd_dlq(args: argparse.Namespace) -> int:
    from streamsched.model.names import internal_topic
    from streamsched.ops.dlq import format_dead_letters, list_dead_letters, replay

    topic = args.topic or internal_topic("dlq", args.scheduler)
    bootstrap = resolve_bootstrap(args.bootstrap)
    if args.action == "list":
        views = asyncio.run(list_dead_letters(bootstrap, topic, limit=args.limit, kind=args.kind))
        print(format_dead_letters(views))
        return 0
    kinds = {args.kind} if args.kind else None
    report = asyncio.run(replay(bootstrap, topic, kinds=kinds, limit=args.limit, dry_run=args.dry_run))
    print(json.dumps(report.to_dict()))
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

    from streamsched.model.identity import route_key
    from streamsched.model.names import validate_name
    from streamsched.wire.transition import encode_transition

    validate_name(args.topic, "topic")
    try:
        doc = json.loads(args.json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--json is not valid JSON (line {exc.lineno} col {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ConfigError("--json must be an object")
    ev = event_from_json(doc)
    key = args.key.encode() if args.key else route_key(ev.tenant, ev.target)
    bootstrap = resolve_bootstrap(args.bootstrap)

    async def send() -> Any:
        producer = clients.producer(bootstrap)
        await producer.start()
        try:
            return await producer.send_and_wait(args.topic, encode_transition(ev), key=key)
        finally:
            await producer.stop()

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

    catalog = Catalog(resolve_bootstrap(args.bootstrap), args.catalog, partitions=args.partitions)

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
            for r in rows:
                cause = f" {r.cause_kind}/{r.cause_category}" if r.cause_kind else ""
                print(f"{_fmt_ns(r.at_ns)}  {r.occurrence:<40} attempt {r.attempt}  {r.state}{cause}")
            return 0
        raise ConfigError(f"unknown schedule action {args.action}")

    if args.action == "tick":
        return _run_ticker(catalog)
    return asyncio.run(run())


def _run_ticker(catalog: Any) -> int:
    from streamsched.schedules.ticker import Ticker, TickerConfig
    from streamsched.worker.intake import worker_config_from_env

    wc = worker_config_from_env(catalog.bootstrap)
    config = TickerConfig(bootstrap=catalog.bootstrap, owner=wc.owner,
                          session_timeout_ms=wc.session_timeout_ms,
                          heartbeat_interval_ms=wc.heartbeat_interval_ms)

    async def main() -> None:
        stop = _stop_on_signals()
        ticker = Ticker(catalog, config)
        await ticker.run(stop)
        print(json.dumps(ticker.metrics.snapshot()), file=sys.stderr)

    _configure_logging()
    asyncio.run(main())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamsched", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("broker", help="run a local Apache Kafka (KRaft) on loopback")
    b.add_argument("action", choices=["start", "stop", "status"])
    b.add_argument("--port", type=int, default=None)
    b.add_argument("--nodes", type=int, default=1)
    b.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    b.set_defaults(fn=cmd_broker)

    t = sub.add_parser("topics", help="apply topic definitions idempotently")
    t.add_argument("action", choices=["apply"])
    t.add_argument("--dir", default="topics")
    t.add_argument("--app", default=None, help="MODULE:ATTR whose schedulers' state topics to apply too")
    t.add_argument("--replication", type=int, default=None)
    t.add_argument("--bootstrap", default=None)
    t.set_defaults(fn=cmd_topics)

    r = sub.add_parser("run", help="run an app's schedulers as consumer-group members")
    r.add_argument("app", help="MODULE:ATTR of a streamsched.App")
    r.add_argument("--scheduler", default=None)
    r.add_argument("--bootstrap", default=None)
    env_port = os.environ.get("STREAMSCHED_STATUS_PORT")
    r.add_argument("--status-port", type=int, default=int(env_port) if env_port else None,
                   help="serve JSON status (/status) and Prometheus metrics (/metrics) on 127.0.0.1:N")
    r.set_defaults(fn=cmd_run)

    dq = sub.add_parser("dlq", help="list dead letters, or replay them to their source topic")
    dq.add_argument("action", choices=["list", "replay"])
    dq.add_argument("scheduler", nargs="?", default=None, help="scheduler whose dead-letter topic to use")
    dq.add_argument("--topic", default=None, help="a dead-letter topic by name instead")
    dq.add_argument("--kind", default=None, help="only this kind (decode, bound, misrouted, terminal, ...)")
    dq.add_argument("--limit", type=int, default=100)
    dq.add_argument("--dry-run", action="store_true", help="replay: count, send nothing")
    dq.add_argument("--bootstrap", default=None)
    dq.set_defaults(fn=cmd_dlq)

    st = sub.add_parser("status", help="print a running worker's counters, gauges and last error")
    st.add_argument("--url", default=os.environ.get("STREAMSCHED_STATUS_URL", "http://127.0.0.1:9464"))
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_status)

    e = sub.add_parser("emit", help="produce one schema-validated transition event")
    e.add_argument("topic")
    e.add_argument("--json", required=True, help='e.g. {"type":"due","tenant":"t1","target":["run-1"]}')
    e.add_argument("--key", default=None, help="record key (default: the identity's route key)")
    e.add_argument("--bootstrap", default=None)
    e.set_defaults(fn=cmd_emit)

    sc = sub.add_parser("schedule", help="durable schedules: add, rm, enable, disable, list, history, tick")
    sc.add_argument("action", choices=["add", "rm", "enable", "disable", "list", "history", "tick"])
    sc.add_argument("name", nargs="?", default=None)
    sc.add_argument("spec", nargs="?", default=None, help="@every 5m | @at 2026-12-24T18:00:00Z | cron")
    sc.add_argument("--target", default=None, help="transition topic the occurrences go to")
    sc.add_argument("--payload", default=None, help="JSON document carried by every occurrence")
    sc.add_argument("--type", default="due", help="transition type of the occurrences")
    sc.add_argument("--tenant", default="")
    sc.add_argument("--policy", choices=["catch_up", "coalesce"], default="catch_up")
    sc.add_argument("--timezone", default=None, help="IANA zone for cron specs")
    sc.add_argument("--catalog", default="default")
    sc.add_argument("--partitions", type=int, default=4, help="partitions of a new catalog's topics")
    sc.add_argument("--json", action="store_true")
    sc.add_argument("--bootstrap", default=None)
    sc.set_defaults(fn=cmd_schedule)
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
        # A SIGTERM that arrives while the worker is still importing must mean "stop cleanly",
        # not the default of dying mid-start.
        signal.signal(signal.SIGTERM, lambda signum, _frame: _early_stop.append(signum))
    try:
        return int(args.fn(args))
    except StreamschedError as exc:
        print(f"streamsched: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from aiokafka.errors import KafkaError

        if isinstance(exc, KafkaError | OSError):
            # Only the error type: messages can carry broker-side detail we do not vouch for.
            print(f"streamsched: Kafka is unreachable or refused the request ({type(exc).__name__})",
                  file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
