"""The argument parser: every command, flag, help text and the STREAMSCHED_* variable a flag
reads (tests check each flag has help and names its variable)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from streamsched.errors import ConfigError
from streamsched.kafka.version import TESTED_KAFKA_VERSIONS
from streamsched.ops.acl import HELP as ACL_HELP
from streamsched.ops.acl import add_acl_arguments
from streamsched.ops.cli.commands import (
    cmd_acl,
    cmd_broker,
    cmd_console,
    cmd_dlq,
    cmd_inspect,
    cmd_outbox,
    cmd_redrive,
    cmd_replay,
    cmd_run,
    cmd_status,
    cmd_topics,
)
from streamsched.ops.cli.common import DEFAULT_DATA_DIR, EXIT_CODES, ArgumentParser, version_text
from streamsched.ops.cli.events import cmd_emit, cmd_schedule

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

manual runs (applied by the schedule's ticker, so they run once even across its restarts):
  trigger NAME      one run now, an occurrence of its own (<schedule-id>/<now-ns>), history
                    rows marked [trigger]
  backfill NAME --from T --to T [--max N] [--dry-run]
                    every boundary in [--from, --to] (RFC 3339 times, not in the future), each
                    the scheduled occurrence <schedule-id>/<planned-ns>: targets resolve those
                    that already ran from their stored outcome. More than --max (default 64,
                    at most 10000) is refused; --dry-run prints them and writes nothing.

list/history print "N unreadable records skipped" on stderr when the catalog holds records
they cannot decode.
"""


_RUN_EPILOG = """\
environment (besides the flags' own):
  STREAMSCHED_SESSION_TIMEOUT_MS  consumer-group session timeout (default 10000)
  STREAMSCHED_HEARTBEAT_MS        heartbeat interval (default 1000)
  STREAMSCHED_COMMIT_INTERVAL_S   how long a Kafka-native transaction gathers batches, and how
                                  often offsets ride a transaction (seconds, 0.1)
  STREAMSCHED_STORE_CACHE_BYTES   with --store-dir: bytes of decoded claims cached in memory per
                                  worker (default 4194304; RocksDB's own cache is separate)
  STREAMSCHED_LOG                 log level: debug, info, warning (default), error; DEBUG also
                                  prints tracebacks
  STREAMSCHED_LOG_FORMAT          text (default) or json: one JSON object per line, with the
                                  scheduler, partition, identity digest, offset and fence

The first SIGTERM or SIGINT drains, commits and leaves the group (exit 0); a second stops at once.
"""


def _horizon(text: str) -> float:
    from streamsched.model.durations import parse_duration
    from streamsched.worker.statebase import check_horizon

    try:
        return check_horizon(parse_duration(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_in(name: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer within [low, high]. A default from the environment is a
    string argparse converts with it only when the flag is absent, so a bad variable is a usage
    error (exit 2) naming the variable, and commands that never read it are unaffected."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be an integer in {low}..{high}, not {text!r}")
        return value

    return convert


def _add_app_options(p: argparse.ArgumentParser) -> None:
    """``--app`` (required) and ``--scheduler``: the commands that act on one scheduler of an app."""
    p.add_argument("--app", required=True, help="MODULE:ATTR of a streamsched.App")
    p.add_argument("--scheduler", default=None, help="scheduler name (optional if the app has one)")


def _add_status_options(p: argparse.ArgumentParser, *, port_from_env: bool) -> None:
    # Only `run` reads STREAMSCHED_STATUS_PORT: a worker and a ticker started from one
    # environment must not both try to bind it.
    env_port = os.environ.get("STREAMSCHED_STATUS_PORT") if port_from_env else None
    p.add_argument("--status-port", type=_int_in("the status port (STREAMSCHED_STATUS_PORT)", 0, 65535),
                   default=env_port or None,
                   help="serve /status (JSON), /metrics (Prometheus), /healthz and /readyz on this port"
                        + (" (env STREAMSCHED_STATUS_PORT)" if port_from_env else "") + "; default: none")
    p.add_argument("--status-host", default=os.environ.get("STREAMSCHED_STATUS_HOST", "127.0.0.1"),
                   help="address the status server binds (env STREAMSCHED_STATUS_HOST; default 127.0.0.1, "
                        "0.0.0.0 in a container)")


def _add_single_replica_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-single-replica", action="store_true",
                   help="allow creating internal topics with replication factor 1 on a multi-broker cluster "
                        "(default: refused; their records would be lost with one broker)")


def build_parser() -> argparse.ArgumentParser:
    from streamsched.ops.config import add_connection_options

    parser = ArgumentParser(
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
    b.add_argument("--kafka-version", default=None, metavar="X.Y.Z",
                   help=f"Apache Kafka release to run (env STREAMSCHED_KAFKA_VERSION; default "
                        f"{TESTED_KAFKA_VERSIONS[-1]}; tested: {', '.join(TESTED_KAFKA_VERSIONS)}); "
                        "a data dir keeps the release it was formatted with")
    b.set_defaults(fn=cmd_broker)

    t = sub.add_parser("topics", help="apply topic definitions idempotently")
    t.add_argument("action", choices=["apply"], help="create missing topics, verify existing ones")
    t.add_argument("--dir", default="topics", help="directory of *.toml topic definitions (default topics)")
    t.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                   help="an app whose schedulers' state, dead-letter and delay topics to apply too "
                        "(repeatable)")
    t.add_argument("--catalog", action="append", default=None, metavar="NAME",
                   help="a schedule catalog whose definitions, state, history and feedback topics to apply "
                        "too (repeatable; for tickers run with `schedule tick --no-create-topics`)")
    t.add_argument("--catalog-partitions", type=int, default=4,
                   help="partitions of those catalog topics (default 4, as `schedule --partitions`)")
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
    r.add_argument("--replication", type=_int_in("the replication factor (STREAMSCHED_REPLICATION)", 1, 16),
                   default=env_rf or None,
                   help="replication factor of the state, dead-letter and delay topics the worker creates "
                        "(env STREAMSCHED_REPLICATION; default min(3, brokers), min.insync.replicas "
                        "min(2, replication)); an explicit one also refuses existing topics that differ")
    _add_single_replica_option(r)
    r.add_argument("--no-create-topics", action="store_true",
                   help="do not create the state, dead-letter and delay topics (a role without CREATE; "
                        "an operator runs `topics apply --app`)")
    r.add_argument("--store-dir", default=None,
                   help="where claim state lives on disk (RocksDB, one store per owned partition, memory "
                        "bounded; a restart reads only the state topic's tail); :memory: keeps it in memory "
                        "(env STREAMSCHED_STORE_DIR; default $XDG_STATE_HOME/streamsched/stores, else "
                        "~/.local/state/streamsched/stores)")
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
    dq.add_argument("--redrive", action="store_true",
                    help="replay: reopen the stored FAILED outcomes of the originals' identities and run "
                         "each original again, through its owner (needs --app; as `redrive --from-dlq`)")
    dq.add_argument("--app", default=None, help="--redrive: MODULE:ATTR of the app running the scheduler")
    dq.add_argument("--reason", default="", help="--redrive: why (kept in the audit trail)")
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

    sc = sub.add_parser("schedule", help="durable schedules: add, rm, enable, disable, list, history, "
                                         "trigger, backfill, tick",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_SCHEDULE_EPILOG)
    sc.add_argument("action", choices=["add", "rm", "enable", "disable", "list", "history", "trigger",
                                       "backfill", "tick"],
                    help="tick runs the ticker that fires due occurrences (a long-running service)")
    sc.add_argument("name", nargs="?", default=None,
                    help="schedule name (add, rm, enable, disable, history, trigger, backfill)")
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
    sc.add_argument("--no-create-topics", action="store_true",
                    help="only verify the catalog's topics, never create them (a ticker role without CREATE; "
                         "an operator runs `topics apply --catalog NAME`); a missing one is exit 2")
    sc.add_argument("--json", action="store_true", help="list: machine output (a JSON array)")
    sc.add_argument("--from", dest="from_time", default=None, help="backfill: window start (RFC 3339)")
    sc.add_argument("--to", dest="to_time", default=None, help="backfill: window end, inclusive (RFC 3339)")
    sc.add_argument("--max", type=int, default=64,
                    help="backfill: most occurrences it may request (default 64, at most 10000)")
    sc.add_argument("--dry-run", action="store_true", help="backfill: print the occurrences, write nothing")
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
    _add_app_options(rp)
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

    ins = sub.add_parser("inspect", help="one workflow's claim: home partition, status, fence, owner, "
                         "lease, outcome and the group's committed offset")
    _add_app_options(ins)
    who = ins.add_mutually_exclusive_group(required=True)
    who.add_argument("--event", default=None, metavar="JSON",
                     help="the event as `emit --event` takes it (its identity under the scheduler)")
    who.add_argument("--identity", default=None, metavar="sched_...",
                     help="a business identity (every state partition is read until it is found)")
    ins.add_argument("-o", "--output", choices=("text", "json"), default="text",
                     help="output format (default: %(default)s)")
    ins.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress on stderr (default: on large state partitions)")
    add_connection_options(ins)
    ins.set_defaults(fn=cmd_inspect)

    rd = sub.add_parser("redrive", help="reopen stored FAILED outcomes so their identities execute again "
                        "(through the identity's owner, audited)")
    _add_app_options(rd)
    what = rd.add_mutually_exclusive_group(required=True)
    what.add_argument("--identity", default=None, metavar="sched_...",
                      help="reopen this identity; its next delivery runs")
    what.add_argument("--event", default=None, metavar="JSON",
                      help="reopen this event's identity and run it again")
    what.add_argument("--from-dlq", action="store_true",
                      help="every dead letter of the scheduler (reopened and run again)")
    rd.add_argument("--kind", default=None, help="--from-dlq: only dead letters of this kind (e.g. terminal)")
    rd.add_argument("--since", default=None, metavar="ISO8601",
                    help="--from-dlq: only dead letters written at or after this time (no offset given: UTC)")
    rd.add_argument("--reason", default="", help="why (kept in the audit trail, at most 200 characters)")
    rd.add_argument("--force", action="store_true",
                    help="also reopen SUCCEEDED outcomes (runs the effect again)")
    rd.add_argument("--dry-run", action="store_true", help="show what would be re-driven, send nothing")
    rd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress on stderr (default: on large state partitions)")
    add_connection_options(rd)
    rd.set_defaults(fn=cmd_redrive)

    co = sub.add_parser("console", help="a web console reading Kafka: schedulers, schedules, dead letters, "
                        "identities and charts (read-only unless --allow-actions)")
    co.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                    help="an app whose schedulers to show (repeatable)")
    co.add_argument("--catalog", action="append", default=None, metavar="NAME",
                    help="a schedule catalog to show (repeatable)")
    co.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1; bound to loopback, only loopback host names "
                         "are answered)")
    co.add_argument("--port", type=int, default=9480, help="port to bind (default 9480; 0: a free one)")
    co.add_argument("--sample-interval", type=float, default=5.0, metavar="SECONDS",
                    help="how often the chart sampler reads lag, offsets and dead letters (default 5)")
    co.add_argument("--allow-actions", action="store_true",
                    help="offer re-drive, schedule enable/disable and dead-letter replay; each needs a token "
                         "(default: read-only, actions refused with 403)")
    co.add_argument("--token-file", default=None, metavar="FILE",
                    help="action tokens, one a line: LABEL TOKEN or TOKEN (label console); the env "
                         "STREAMSCHED_CONSOLE_TOKEN adds one more (label console)")
    add_connection_options(co)
    co.set_defaults(fn=cmd_console)

    ac = sub.add_parser("acl", help=ACL_HELP)
    add_acl_arguments(ac)  # with the connection options
    ac.set_defaults(fn=cmd_acl)
    return parser
