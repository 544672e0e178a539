"""Event and schedule commands: ``emit`` (one validated transition through
:class:`streamsched.Producer`) and ``schedule`` (the catalog's add/rm/enable/disable/list/history,
trigger/backfill, and ``tick``, the ticker service)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
from typing import Any

from streamsched.errors import ConfigError
from streamsched.ops.cli.common import configure_logging, connect, run_service, serve_status, stop_on_signals
from streamsched.ops.cli.output import show

# --- emit -----------------------------------------------------------------------------------------

def event_from_json(doc: dict[str, Any]) -> Any:
    """A validated TransitionEvent from the CLI's JSON (the shape of
    :func:`streamsched.model.event.event_from_mapping`); raises DecodeError naming the field."""
    from streamsched.model.event import event_from_mapping
    from streamsched.wire.transition import decode_transition, encode_transition

    # Round-trip through the decoder: `emit` refuses anything a worker would dead-letter.
    return decode_transition(encode_transition(event_from_mapping(doc)))


def event_arg(text: str) -> Any:
    """The TransitionEvent of an ``--event`` flag's JSON (a ConfigError names what is wrong)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--event is not valid JSON (line {exc.lineno} col {exc.colno})") from None
    if not isinstance(doc, dict):
        raise ConfigError("--event must be a JSON object")
    return event_from_json(doc)


def cmd_emit(args: argparse.Namespace) -> int:
    from streamsched.kafka.admin import partition_counts
    from streamsched.kafka.producer import Producer, encode_event
    from streamsched.model.names import validate_name

    validate_name(args.topic, "topic")
    ev = event_arg(args.event)
    key, _ = encode_event(ev)
    if args.key and args.key.encode() != key:
        # Any other key puts the identity on a partition its owner never sees (dead-lettered).
        raise ConfigError("--key must be the event's route key (omit it: emit sets the route key)")
    bootstrap = connect(args)

    async def send() -> Any:
        # A missing topic is bad input, named at once (exit 2): the producer alone would wait for
        # its metadata until the request timeout, warning on every retry, then fail like an
        # unreachable cluster.
        await partition_counts(bootstrap, [args.topic], authorized=True)
        async with Producer(bootstrap, wire_format=args.wire_format) as producer:
            return await producer.send(args.topic, ev)

    md = asyncio.run(send())
    show(args, {"topic": md.topic, "partition": md.partition, "offset": md.offset, "event_id": ev.event_id})
    return 0


# --- schedule -------------------------------------------------------------------------------------

def _fmt_ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _overlap_note(row: dict[str, Any]) -> str:
    """The list's last column: the overlap policy, the run it waits on and a held boundary, and a
    paused schedule's reason."""
    parts = [row["overlap"]]
    if row["running_ns"] is not None:
        parts.append(f"waits on {_fmt_ns(row['running_ns'])}")
    if row["buffered_ns"] is not None:
        parts.append(f"holds {_fmt_ns(row['buffered_ns'])}")
    if row["pause_reason"]:
        parts.append(f"paused: {row['pause_reason']}")
    return ", ".join(parts)


def _name(args: argparse.Namespace) -> str:
    if not args.name:
        raise ConfigError(f"schedule {args.action} needs the schedule's name")
    return str(args.name)


def _instant(text: str, option: str) -> int:
    """UTC nanoseconds of an RFC 3339 time with an offset (as ``@at`` takes it)."""
    from streamsched.errors import InvalidSpec
    from streamsched.model.specs import At, parse_spec

    try:
        spec = parse_spec(f"@at {text}")
    except InvalidSpec as exc:
        raise ConfigError(f"{option}: {exc}") from None
    assert isinstance(spec, At)
    return spec.at_ns


def cmd_schedule(args: argparse.Namespace) -> int:
    from streamsched.schedules.catalog import Catalog

    # Only add and tick take the topic-creation flags: the other actions never create topics.
    catalog = Catalog(connect(args), args.catalog, partitions=getattr(args, "partitions", 4),
                      replication=getattr(args, "replication", None),
                      allow_single_replica=getattr(args, "allow_single_replica", False),
                      create_topics=not getattr(args, "no_create_topics", False))

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
                                       policy=args.policy, timezone=args.timezone, overlap=args.overlap)
            show(args, {"name": d.name, "version": d.version, "schedule_id": d.schedule_id})
            return 0
        if args.action in ("rm", "enable", "disable"):
            fn = {"rm": catalog.unschedule, "enable": catalog.enable, "disable": catalog.disable}
            found = await fn[args.action](args.name)
            show(args, {"name": args.name, args.action: found})
            return 0 if found else 1
        if args.action == "list":
            infos = await catalog.list()
            if infos.skipped_corrupt:
                print(f"{infos.skipped_corrupt} unreadable records skipped", file=sys.stderr)
            if args.output == "json":
                print(json.dumps([i.as_dict() for i in infos]))
                return 0
            print(f"{'name':<24} {'spec':<20} {'status':<10} {'next planned (UTC)':<28} "
                  "fired skipped  overlap")
            for i in infos:
                row = i.as_dict()
                print(f"{row['name']:<24} {row['spec']:<20} {row['status']:<10} "
                      f"{_fmt_ns(row['next_planned_ns']):<28} {row['fired']:>5} {row['skipped']:>7}  "
                      f"{_overlap_note(row)}")
            return 0
        if args.action == "history":
            rows = await catalog.history(args.name)
            if rows.skipped_corrupt:
                print(f"{rows.skipped_corrupt} unreadable records skipped", file=sys.stderr)
            # A manual run's RUNNING row says which request it was; a trigger's occurrence is its
            # own, so its result rows say so too (a backfilled one shares the scheduled identity).
            triggered = {r.occurrence for r in rows if r.manual == "trigger"}
            if args.output == "json":
                print(json.dumps([{**dataclasses.asdict(r), "manual": r.manual or (
                    "trigger" if r.occurrence in triggered else None)} for r in rows]))
                return 0
            for r in rows:
                cause = f" {r.cause_kind}/{r.cause_category}" if r.cause_kind and not r.manual else ""
                kind = r.manual or ("trigger" if r.occurrence in triggered else None)
                tag = f"  [{kind}]" if kind else ""
                print(f"{_fmt_ns(r.at_ns)}  {r.occurrence:<40} attempt {r.attempt}  {r.state}{cause}{tag}")
            return 0
        if args.action in ("pause", "resume"):
            hold = catalog.pause(args.name, reason=args.reason) if args.action == "pause" \
                else catalog.resume(args.name)
            show(args, (await hold).as_dict())
            return 0
        if args.action == "trigger":
            show(args, (await catalog.trigger(_name(args))).as_dict())
            return 0
        if args.action == "backfill":
            if args.from_time is None or args.to_time is None:
                raise ConfigError("backfill needs --from and --to")
            receipt = await catalog.backfill(_name(args), _instant(args.from_time, "--from"),
                                             _instant(args.to_time, "--to"), max=args.max,
                                             dry_run=args.dry_run)
            show(args, receipt.as_dict())
            return 0
        raise ConfigError(f"unknown schedule action {args.action}")

    if args.action == "tick":
        return _run_ticker(catalog, args)
    return asyncio.run(run())


def ticker_config(bootstrap: Any, instance_id: str | None = None) -> Any:
    """The ticker's group settings from the same ``STREAMSCHED_*`` variables as a worker's. A
    ticker keeps no claim store: the image's ``STREAMSCHED_STORE_DIR`` (absent or read-only in a
    ticker's pod) is never looked at."""
    from streamsched.schedules.ticker import TickerConfig
    from streamsched.worker.intake import worker_config_from_env
    from streamsched.worker.rocksenv import MEMORY

    given: dict[str, Any] = {"instance_id": instance_id} if instance_id is not None else {}
    wc = worker_config_from_env(bootstrap, store_dir=MEMORY, **given)
    return TickerConfig(bootstrap=bootstrap, owner=wc.owner, session_timeout_ms=wc.session_timeout_ms,
                        heartbeat_interval_ms=wc.heartbeat_interval_ms, instance_id=wc.instance_id,
                        transactions=wc.transactions)


def _run_ticker(catalog: Any, args: argparse.Namespace) -> int:
    from streamsched.schedules.ticker import Ticker

    config = ticker_config(catalog.bootstrap, args.instance_id)

    async def main() -> None:
        stop = stop_on_signals()
        ticker = Ticker(catalog, config)
        async with contextlib.AsyncExitStack() as stack:
            await serve_status(stack, args, [ticker.metrics],
                                lambda: ticker.ready)
            await ticker.run(stop)
        print(json.dumps(ticker.metrics.snapshot()), file=sys.stderr)

    configure_logging()
    return run_service(main)
