"""The commands with actions, one subparser per action (each with its own usage, help and
flags): ``broker``, ``topics``, ``dlq``, ``schedule``, ``outbox`` and ``acl``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from streamsched.kafka.version import TESTED_KAFKA_VERSIONS
from streamsched.ops.cli.commands import cmd_acl, cmd_broker, cmd_dlq, cmd_outbox, cmd_topics
from streamsched.ops.cli.common import DEFAULT_DATA_DIR
from streamsched.ops.cli.dr import add_scope, add_source
from streamsched.ops.cli.events import cmd_schedule
from streamsched.ops.cli.grammar import (
    APP_HELP,
    Parser,
    add_app,
    add_connection,
    add_instance_id,
    add_output,
    add_scheduler,
    add_single_replica_option,
    add_status_options,
    command,
    deprecated,
    duration,
    family,
    seconds,
)

DLQ_KINDS = ("decode", "schema", "bound", "misrouted", "terminal", "attempts_exhausted", "corrupt")
"""The kinds of dead letter a worker writes (wire/dead_letter.py), and ``corrupt`` (unreadable)."""

_SCHEDULE_EPILOG = """\
missed boundaries (--policy), after downtime:
  The missed boundaries are those after the last one planned, up to and including now; say D.
  catch_up  fires the first 64 in order, then the latest (the current occurrence):
            D <= 65: all D fire, none skipped; D > 65: 65 fire, the D - 65 between the
            64th and the latest are skipped.
  coalesce  fires only the latest; D - 1 are skipped.
  Boundaries skipped here never fire and get no history row; `schedule list` counts them.
  Example, D = 100: catch_up fires the 1st-64th and the 100th, skips 35;
  coalesce fires the 100th, skips 99. One run fires at most 65 occurrences per schedule.
  A resumed schedule (`schedule resume`) fires what its pause missed by the same rule.

a boundary while the previous run has not resolved (--overlap):
  allow       fires it anyway (the default).
  skip        does not fire it: counted as skipped, the first of each run in the history as
              SKIPPED.
  buffer_one  holds the first such boundary and fires it once the run resolves; later ones are
              skipped as under skip.
  A run resolves when its target worker reports its outcome (streamsched workers do);
  manual runs neither wait nor are waited for.
"""

_MANUAL_EPILOG = """\
Manual runs are applied by the schedule's ticker, so they run once even across its restarts.
A triggered run is an occurrence of its own (<schedule-id>/<now-ns>), its history rows marked
[trigger]. A backfill requests every boundary in [--from, --to] (RFC 3339 times, not in the
future), each the scheduled occurrence <schedule-id>/<planned-ns>: targets resolve those that
already ran from their stored outcome.
"""


def add_broker(sub: Any) -> None:
    fam = family(sub, "broker", "run a local Apache Kafka (KRaft) on loopback")

    def data_dir(p: Parser) -> None:
        p.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR),
                       help="where the cluster keeps its logs and state")

    b = command(fam, "start", "start the local broker (prints its bootstrap address)", cmd_broker)
    b.add_argument("--port", type=int, default=None, help="client port of the first node (default: free)")
    b.add_argument("--nodes", type=int, default=1, help="brokers in the local cluster")
    data_dir(b)
    b.add_argument("--security", choices=["none", "sasl"], default="none",
                   help="sasl: SASL_PLAINTEXT with SCRAM users, the StandardAuthorizer and super user admin "
                        "(connection files for --config are written under DATA_DIR/security)")
    b.add_argument("--tls", action="store_true",
                   help="with --security sasl: also SASL_SSL and client-certificate SSL listeners, with a "
                        "CA made for this broker (openssl)")
    b.add_argument("--user", action="append", default=None, metavar="NAME",
                   help="with --security sasl: a SCRAM user created at format time (repeatable)")
    b.add_argument("--kafka-version", default=None, metavar="X.Y.Z",
                   help=f"Apache Kafka release to run (env STREAMSCHED_KAFKA_VERSION; default "
                        f"{TESTED_KAFKA_VERSIONS[-1]}; tested: {', '.join(TESTED_KAFKA_VERSIONS)}); "
                        "a data dir keeps the release it was formatted with")
    data_dir(command(fam, "stop", "stop the local broker", cmd_broker))
    s = command(fam, "status", "show the local broker (exit 1 when it is not running)", cmd_broker)
    data_dir(s)
    add_output(s, default="json", json_alias=None)


def add_topics(sub: Any) -> None:
    fam = family(sub, "topics", "apply topic definitions idempotently")
    t = command(fam, "apply", "create missing topics, verify existing ones", cmd_topics)
    add_scope(t, what="apply")
    add_source(t, required=False)
    t.add_argument("--replication", type=int, default=None,
                   help="replication factor of every topic applied (default: each definition's, else "
                        "min(3, brokers); internal topics get min.insync.replicas min(2, replication))")
    t.add_argument("--allow-drift", action="store_true",
                   help="accept and report existing topics whose replication or min.insync.replicas differ "
                        "from the definition (default: refuse, exit 2)")
    add_single_replica_option(t)
    add_output(t, default="json", json_alias=None)
    add_connection(t)


def _dlq_source(p: Parser) -> None:
    deprecated(p, "scheduler_positional", target="scheduler", use="--scheduler", metavar="SCHEDULER")
    add_scheduler(p, help="scheduler whose dead-letter topic to use")
    p.add_argument("--topic", default=None, help="a dead-letter topic by name instead of --scheduler")
    p.add_argument("--kind", default=None, choices=DLQ_KINDS, help="only dead letters of this kind")
    p.add_argument("--limit", type=int, default=100, help="at most this many dead letters")
    p.checks.append(lambda a: None if bool(a.scheduler) != bool(a.topic)
                    else "one of --scheduler NAME or --topic TOPIC is required (not both)")


def add_dlq(sub: Any) -> None:
    fam = family(sub, "dlq", "list dead letters, or replay them to their source topic")
    ls = command(fam, "list", "list a scheduler's newest dead letters (safe fields only)", cmd_dlq)
    _dlq_source(ls)
    ls.add_argument("--oldest", action="store_true",
                    help="the oldest dead letters, oldest first (default: the newest, newest first; "
                         "by record time across partitions)")
    add_output(ls, json_alias=None)
    add_connection(ls)
    rp = command(fam, "replay", "replay dead letters to their source topic, or re-drive them", cmd_dlq)
    _dlq_source(rp)
    rp.add_argument("--dry-run", action="store_true", help="count, send nothing")
    rp.add_argument("--redrive", action="store_true",
                    help="reopen the stored FAILED outcomes of the originals' identities and run each "
                         "original again, through its owner (needs --app; as `redrive --from-dlq`)")
    add_app(rp, required=False, help=f"--redrive: {APP_HELP} running the scheduler")
    rp.add_argument("--reason", default="", help="--redrive: why (kept in the audit trail)")
    rp.checks.append(lambda a: None if a.redrive or not (a.app or a.reason)
                     else "--app and --reason apply to --redrive only")
    rp.checks.append(lambda a: "--redrive needs --app MODULE:ATTR" if a.redrive and not a.app else None)
    add_output(rp, default="json", json_alias=None)
    add_connection(rp)


def _catalog(p: Parser, *, creates: bool = False) -> None:
    p.add_argument("--catalog", default="default", help="catalog name")
    if creates:
        p.add_argument("--partitions", type=int, default=4, help="partitions of a new catalog's topics")
        p.add_argument("--replication", type=int, default=None,
                       help="replication factor of a new catalog's topics (default min(3, brokers), "
                            "min.insync.replicas min(2, replication)); an explicit one refuses topics "
                            "that differ")
        add_single_replica_option(p)
        p.add_argument("--no-create-topics", action="store_true",
                       help="only verify the catalog's topics, never create them (a ticker role without "
                            "CREATE; an operator runs `topics apply --catalog NAME`); a missing one is "
                            "exit 2")
    add_connection(p)


def _timezone_fits(args: argparse.Namespace) -> str | None:
    head = args.spec.split()[0] if args.spec.split() else ""
    if args.timezone is not None and head in ("@every", "@at"):
        return f"--timezone applies to cron specs only, not {head} (an absolute time or interval)"
    return None


def add_schedule(sub: Any) -> None:
    fam = family(sub, "schedule", "durable schedules: add, rm, enable, disable, pause, resume, list, "
                 "history, trigger, backfill, tick")
    a = command(fam, "add", "add a schedule, or replace the one of that name", cmd_schedule,
                epilog=_SCHEDULE_EPILOG)
    a.add_argument("name", metavar="NAME", help="schedule name")
    a.add_argument("spec", metavar="SPEC", help="@every 5m | @at 2026-12-24T18:00:00Z | cron (5 fields)")
    a.add_argument("--target", required=True, metavar="TOPIC", help="transition topic the occurrences go to")
    a.add_argument("--payload", default=None, metavar="JSON",
                   help="JSON document carried by every occurrence")
    a.add_argument("--type", default="due", help="transition type of the occurrences")
    a.add_argument("--tenant", default="", help="tenant of the occurrences (default empty)")
    a.add_argument("--policy", choices=["catch_up", "coalesce"], default="catch_up",
                   help="what fires after downtime (see below)")
    a.add_argument("--overlap", choices=["allow", "skip", "buffer_one"], default="allow",
                   help="what a boundary does while the previous run has not resolved (see below)")
    a.add_argument("--timezone", default=None, metavar="ZONE", help="IANA zone of a cron spec (default: UTC)")
    a.checks.append(_timezone_fits)
    add_output(a, default="json", json_alias=None)
    _catalog(a, creates=True)
    for name, text in (("rm", "remove a schedule (exit 1 if there is none)"),
                       ("enable", "enable a schedule (exit 1 if there is none)"),
                       ("disable", "disable a schedule: nothing fires until enabled (exit 1 if there is "
                                   "none)"),
                       ("trigger", "one run now, an occurrence of its own (applied by the ticker)"),
                       ("pause", "stop firing a schedule, keeping its catch-up position (applied by the "
                                 "ticker)"),
                       ("resume", "fire a paused schedule again: what the pause missed fires under its "
                                  "policy")):
        p = command(fam, name, text, cmd_schedule, epilog=_MANUAL_EPILOG if name == "trigger" else None)
        p.add_argument("name", metavar="NAME", help="schedule name")
        if name == "pause":
            p.add_argument("--reason", default="", metavar="TEXT",
                           help="why (kept with the request, shown by `schedule list`; 200 characters)")
        add_output(p, default="json", json_alias=None)
        _catalog(p)
    ls = command(fam, "list", "every schedule: spec, status, next planned time, fired and skipped counts",
                 cmd_schedule, epilog='"N unreadable records skipped" on stderr when the catalog holds '
                                      "records it cannot decode.")
    add_output(ls)
    _catalog(ls)
    h = command(fam, "history", "a schedule's recent occurrences and their results", cmd_schedule,
                epilog="rows of manual runs end in [trigger] or [backfill].")
    h.add_argument("name", metavar="NAME", help="schedule name")
    add_output(h, json_alias=None)
    _catalog(h)
    bf = command(fam, "backfill", "run every boundary of a past window", cmd_schedule, epilog=_MANUAL_EPILOG)
    bf.add_argument("name", metavar="NAME", help="schedule name")
    bf.add_argument("--from", dest="from_time", required=True, metavar="RFC3339", help="window start")
    bf.add_argument("--to", dest="to_time", required=True, metavar="RFC3339", help="window end, inclusive")
    bf.add_argument("--max", type=int, default=64,
                    help="most occurrences it may request (at most 10000; more is refused)")
    bf.add_argument("--dry-run", action="store_true", help="print the occurrences, write nothing")
    add_output(bf, default="json", json_alias=None)
    _catalog(bf)
    tk = command(fam, "tick", "run the ticker that fires due occurrences (a long-running service)",
                 cmd_schedule, epilog=_SCHEDULE_EPILOG)
    _catalog(tk, creates=True)
    add_instance_id(tk)
    add_status_options(tk, port_from_env=False)


def add_outbox(sub: Any) -> None:
    fam = family(sub, "outbox", "relay an outbox table's intents to Kafka; show or requeue them")

    def table(p: Parser) -> None:
        p.add_argument("--dsn", default=os.environ.get("STREAMSCHED_OUTBOX_DSN"),
                       help="sqlite:///path.db, sqlite:////abs/path.db or postgresql://... "
                            "(env STREAMSCHED_OUTBOX_DSN; required)")
        p.add_argument("--table", default="streamsched_outbox", help="outbox table")
        p.checks.append(lambda a: None if a.dsn else
                        "the following arguments are required: --dsn (or STREAMSCHED_OUTBOX_DSN)")

    r = command(fam, "relay", "publish the table's intents to Kafka until SIGTERM (a long-running service)",
                cmd_outbox)
    table(r)
    r.add_argument("--worker-id", default=None, help="lease owner name (default relay-<host>-<pid>)")
    r.add_argument("--batch-size", type=int, default=16, help="intents claimed per round (max 64)")
    r.add_argument("--lease", type=duration, default="30s", metavar="DURATION",
                   help="lease: the longest one delivery may take (e.g. 30s, 2m)")
    deprecated(r, "--lease-s", target="lease", use="--lease DURATION", convert=seconds, metavar="SECONDS")
    r.add_argument("--max-attempts", type=int, default=5, help="deliveries before an intent is dead")
    r.add_argument("--create-schema", action="store_true", help="create the table if missing")
    r.add_argument("--keep-delivered", type=duration, default=0.0, metavar="DURATION",
                   help="keep delivered intents this long (e.g. 15m, at most 7d) so `outbox resend` can "
                        "send them again after a failover (default 0: deleted once delivered)")
    r.add_argument("--dir", default="topics",
                   help="directory of *.toml topic definitions: intents for a topic defined with "
                        "format = \"registry\" are framed for the schema registry")
    add_connection(r)
    add_status_options(r, port_from_env=False)
    s = command(fam, "status", "counts: pending, leased, dead (by kind)", cmd_outbox)
    table(s)
    add_output(s, default="json", json_alias=None)
    q = command(fam, "requeue", "give dead intents a fresh set of attempts", cmd_outbox)
    table(q)
    q.add_argument("--kind", default=None, help="only dead intents of this kind")
    add_output(q, default="json", json_alias=None)
    rs = command(fam, "resend", "send again the intents delivered since a time (kept by relays run with "
                 "--keep-delivered): after a failover to a mirrored cluster", cmd_outbox)
    table(rs)
    rs.add_argument("--since", required=True, metavar="TIME",
                    help="an ISO 8601 time (no offset: UTC), or a duration ago (e.g. 5m)")
    rs.add_argument("--topic", default=None, help="only intents to this topic")
    add_output(rs, default="json", json_alias=None)


def add_acl(sub: Any) -> None:
    from streamsched.ops.acl import HELP, add_acl_arguments

    p = sub.add_parser("acl", help=HELP, description=HELP[:1].upper() + HELP[1:])
    add_acl_arguments(p, cmd_acl)
