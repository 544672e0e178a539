"""The argument parser: every command, flag, help text and the STREAMSCHED_* variable a flag
reads (tests check each flag has help and names its variable). Commands with actions (broker,
topics, schedule, dlq, outbox, acl) have one subparser per action: :mod:`.parser_families`.
The shared grammar (deprecated spellings, durations, ``-o``) is :mod:`.grammar`."""

from __future__ import annotations

import argparse
import os

from streamsched.errors import ConfigError
from streamsched.ops.cli.commands import (
    cmd_cancel,
    cmd_console,
    cmd_inspect,
    cmd_pause,
    cmd_redrive,
    cmd_replay,
    cmd_run,
    cmd_status,
)
from streamsched.ops.cli.common import EXIT_CODES, version_text
from streamsched.ops.cli.dr import add_dr
from streamsched.ops.cli.events import cmd_emit
from streamsched.ops.cli.grammar import (
    APP_HELP,
    ArgumentTypeError,
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
    int_in,
)
from streamsched.ops.cli.parser_families import (
    DLQ_KINDS,
    add_acl,
    add_broker,
    add_dlq,
    add_outbox,
    add_schedule,
    add_topics,
)
from streamsched.ops.cli.schemas import add_schemas
from streamsched.wire.registry import FORMATS

_RUN_EPILOG = """\
environment (besides the flags' own):
  STREAMSCHED_SESSION_TIMEOUT     consumer-group session timeout, a duration (default 10s)
  STREAMSCHED_HEARTBEAT           heartbeat interval, a duration (default 1s)
  STREAMSCHED_COMMIT_INTERVAL     how long a Kafka-native transaction gathers batches, and how
                                  often offsets ride a transaction, a duration (default 0.1s)
  STREAMSCHED_STORE_CACHE_BYTES   with --store-dir: bytes of decoded claims cached in memory, all
                                  owned partitions together (default 33554432; RocksDB's own cache
                                  is separate)
  STREAMSCHED_STORE_BLOCK_CACHE_BYTES
                                  with --store-dir: bytes of RocksDB's block cache, shared by the
                                  worker's stores (default 16777216)
  STREAMSCHED_TRANSACTIONS        worker (default: one transactional producer per process, its
                                  offsets checked against the group generation) or partition
                                  (legacy: one per owned partition, for brokers before 2.5)
  STREAMSCHED_LOG                 log level: debug, info, warning (default), error; DEBUG also
                                  prints tracebacks
  STREAMSCHED_LOG_FORMAT          text (default) or json: one JSON object per line, with the
                                  scheduler, partition, identity digest, offset and fence

The first SIGTERM or SIGINT drains, commits and leaves the group (exit 0); a second stops at once.
With --instance-id (static membership) it does not leave: its partitions wait for a successor under
the same id, up to the session timeout, and move only then.
"""


def _horizon(text: str) -> float:
    from streamsched.worker.statebase import check_horizon

    try:
        return check_horizon(duration(text))
    except ConfigError as exc:
        raise ArgumentTypeError(str(exc)) from None


def _needs_app(args: argparse.Namespace) -> str | None:
    return None if args.app else "the following arguments are required: --app"


def build_parser() -> Parser:
    parser = Parser(
        prog="streamsched", epilog=EXIT_CODES,
        description="Durable workflow schedulers on Apache Kafka. `streamsched COMMAND --help` tells "
                    "each command's flags (and the STREAMSCHED_* variable each one reads).")
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print streamsched's version (and aiokafka's, Python's) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    add_broker(sub)
    add_topics(sub)

    r = command(sub, "run", "run an app's schedulers as consumer-group members", cmd_run, epilog=_RUN_EPILOG)
    add_app(r, required=False, help=f"{APP_HELP} (required)")
    deprecated(r, "app_positional", target="app", use="--app", metavar="APP")
    r.checks.append(_needs_app)
    add_scheduler(r, help="run only this scheduler of the app (default: all)")
    env_rf = os.environ.get("STREAMSCHED_REPLICATION")
    r.add_argument("--replication", type=int_in("the replication factor (STREAMSCHED_REPLICATION)", 1, 16),
                   default=env_rf or None,
                   help="replication factor of the state, dead-letter and delay topics the worker creates "
                        "(env STREAMSCHED_REPLICATION; default min(3, brokers), min.insync.replicas "
                        "min(2, replication)); an explicit one also refuses existing topics that differ")
    add_single_replica_option(r)
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
    add_instance_id(r)
    add_connection(r)
    add_status_options(r, port_from_env=True)

    st = command(sub, "status", "print a running worker's counters, gauges and last error", cmd_status)
    st.add_argument("url_arg", nargs="?", default=None, metavar="URL",
                    help="status server, e.g. http://127.0.0.1:9464 (same as --url)")
    st.add_argument("--url", default=os.environ.get("STREAMSCHED_STATUS_URL", "http://127.0.0.1:9464"),
                    help="status server (env STREAMSCHED_STATUS_URL; default http://127.0.0.1:9464)")
    add_output(st)

    e = command(sub, "emit", "produce one schema-validated transition event", cmd_emit,
                description="Produce one schema-validated transition event; prints where it went "
                            "(topic, partition, offset) and its event_id.")
    e.add_argument("topic", metavar="TOPIC", help="transition topic to produce to")
    e.add_argument("--event", metavar="JSON",
                   help='the event as a JSON object, e.g. {"type":"due","tenant":"t1","target":["run-1"]} '
                        "(required)")
    deprecated(e, "--json", target="event", use="--event", metavar="JSON")
    e.checks.append(lambda a: None if a.event is not None
                    else "the following arguments are required: --event")
    e.add_argument("--key", default=None,
                   help="record key; must equal the identity's route key (the default), else refused")
    e.add_argument("--wire-format", default="streamsched", choices=FORMATS,
                   help="how the topic frames events: streamsched (our envelope) or registry (the schema "
                        "registry's framing; needs --registry-url)")
    add_output(e, default="json", json_alias=None)
    add_connection(e)

    add_schemas(sub)
    add_dlq(sub)
    add_schedule(sub)
    add_outbox(sub)
    rp = command(sub, "replay", "re-run a scheduler over its topic from an offset or a time "
                 "(resets its group's offsets), or --verify that a replay runs nothing new", cmd_replay)
    add_app(rp)
    add_scheduler(rp)
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
    rp.checks.append(lambda a: "--per-identity and --progress apply to --verify only"
                     if not a.verify and (a.per_identity or a.progress is not None) else None)
    rp.checks.append(lambda a: "--dry-run does not apply to --verify (it never commits)"
                     if a.verify and a.dry_run else None)
    add_output(rp, default="json", json_alias=None)
    add_connection(rp)

    ins = command(sub, "inspect", "one workflow's claim: home partition, status, fence, owner, "
                  "lease, outcome and the group's committed offset", cmd_inspect)
    add_app(ins)
    add_scheduler(ins)
    who = ins.add_mutually_exclusive_group(required=True)
    who.add_argument("--event", default=None, metavar="JSON",
                     help="the event as `emit --event` takes it (its identity under the scheduler)")
    who.add_argument("--identity", default=None, metavar="sched_...",
                     help="a business identity (every state partition is read until it is found)")
    add_output(ins, json_alias=None)
    ins.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress on stderr (default: on large state partitions)")
    add_connection(ins)

    rd = command(sub, "redrive", "reopen stored FAILED outcomes so their identities execute again "
                 "(through the identity's owner, audited)", cmd_redrive)
    add_app(rd)
    add_scheduler(rd)
    what = rd.add_mutually_exclusive_group(required=True)
    what.add_argument("--identity", default=None, metavar="sched_...",
                      help="reopen this identity; its next delivery runs")
    what.add_argument("--event", default=None, metavar="JSON",
                      help="reopen this event's identity and run it again")
    what.add_argument("--from-dlq", action="store_true",
                      help="every dead letter of the scheduler (reopened and run again)")
    rd.add_argument("--kind", default=None, choices=DLQ_KINDS,
                    help="--from-dlq: only dead letters of this kind (e.g. terminal)")
    rd.add_argument("--since", default=None, metavar="ISO8601",
                    help="--from-dlq: only dead letters written at or after this time (no offset given: UTC)")
    rd.checks.append(lambda a: "--kind and --since apply to --from-dlq only"
                     if not a.from_dlq and (a.kind or a.since) else None)
    rd.add_argument("--reason", default="", help="why (kept in the audit trail, at most 200 characters)")
    rd.add_argument("--force", action="store_true",
                    help="also reopen SUCCEEDED outcomes (runs the effect again)")
    rd.add_argument("--dry-run", action="store_true", help="show what would be re-driven, send nothing")
    rd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress on stderr (default: on large state partitions)")
    add_output(rd, default="json", json_alias=None)
    add_connection(rd)

    ca = command(sub, "cancel", "cancel work that waits (a retry in its backoff, an event before its due "
                 "time) so it never runs (through the identity's owner, audited)", cmd_cancel)
    add_app(ca)
    add_scheduler(ca)
    which = ca.add_mutually_exclusive_group(required=True)
    which.add_argument("--identity", default=None, metavar="sched_...",
                       help="cancel this identity (one never claimed has no snapshot to find: give --event)")
    which.add_argument("--event", default=None, metavar="JSON",
                       help="cancel this event's identity, also before its first claim (waiting for its "
                            "due time)")
    ca.add_argument("--reason", required=True, metavar="TEXT",
                    help="why (kept in the audit trail, at most 200 characters)")
    ca.add_argument("--dry-run", action="store_true", help="show what would be cancelled, send nothing")
    ca.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress on stderr (default: on large state partitions)")
    add_output(ca, default="json", json_alias=None)
    add_connection(ca)

    for verb, doing in (("pause", "stop taking new work"), ("resume", "take new work again")):
        pa = command(sub, verb, f"{doing}: a durable request every worker of the scheduler follows, "
                     "now and after restarts (audited)", cmd_pause)
        # The name as the first word (what an operator types) or as --scheduler, as every command
        # that loads an app takes it; with --app holding one scheduler, neither.
        pa.add_argument("scheduler_name", metavar="SCHEDULER", nargs="?", default=None,
                        help="the scheduler's name (or --scheduler NAME)")
        add_scheduler(pa, help="the scheduler's name (as SCHEDULER)")
        pa.add_argument("--reason", default="", required=verb == "pause",
                        help="why (kept in the control topic's history, at most 200 characters)")
        add_app(pa, required=False, help=f"{APP_HELP} declaring SCHEDULER (checked before anything is sent)")
        add_output(pa, default="json", json_alias=None)
        add_connection(pa)
        pa.set_defaults(paused=verb == "pause")

    co = command(sub, "console", "a web console reading Kafka: schedulers, schedules, dead letters, "
                 "identities and charts (read-only unless --allow-actions)", cmd_console)
    co.add_argument("--app", action="append", default=None, metavar="MODULE:ATTR",
                    help="an app whose schedulers to show (repeatable)")
    co.add_argument("--catalog", action="append", default=None, metavar="NAME",
                    help="a schedule catalog to show (repeatable)")
    co.add_argument("--worker", action="append", default=None, metavar="URL",
                    help="a worker's status server, e.g. http://127.0.0.1:9464: the schedulers page shows "
                         "its circuit breakers, pause and rate budget (repeatable)")
    co.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1; bound to loopback, only loopback host names "
                         "are answered)")
    co.add_argument("--port", type=int, default=9480, help="port to bind (0: a free one)")
    co.add_argument("--sample-interval", type=duration, default="5s", metavar="DURATION",
                    help="how often the chart sampler reads lag, offsets and dead letters (e.g. 5s, 1m)")
    co.add_argument("--allow-actions", action="store_true",
                    help="offer re-drive, schedule enable/disable and dead-letter replay; each needs a token "
                         "(default: read-only, actions refused with 403)")
    co.add_argument("--token-file", default=None, metavar="FILE",
                    help="action tokens, one a line: LABEL TOKEN or TOKEN (label console); the env "
                         "STREAMSCHED_CONSOLE_TOKEN adds one more (label console)")
    add_connection(co)

    from streamsched.ops.cli.completion import cmd_completion

    cp = command(sub, "completion", "print a shell completion script (bash or zsh)", cmd_completion,
                 description="Print a completion script for bash or zsh, generated from this parser. "
                             "bash: `source <(streamsched completion bash)`; zsh: "
                             "`streamsched completion zsh > \"${fpath[1]}/_streamsched\"`.")
    cp.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete for")
    cp.set_defaults(root_parser=parser)
    add_acl(sub)
    add_dr(sub)
    return parser
