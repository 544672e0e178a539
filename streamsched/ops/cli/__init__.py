"""``streamsched`` command line: broker, topics, run, emit, status, inspect, redrive, cancel,
pause, resume, console, dlq, schedule, outbox, replay, acl.

Every failure is one line on stderr with a documented exit code (:data:`EXIT_CODES`).

Layout: :mod:`.common` (connection, app loader, signals, status server, failure report),
:mod:`.commands` (operator commands), :mod:`.events` (emit and schedules), :mod:`.parser`
(every flag and its help). This module holds only :func:`main`.
"""

from __future__ import annotations

import os
import signal
import sys

from streamsched.kafka import clientlog
from streamsched.ops.cli.commands import (
    cmd_acl,
    cmd_broker,
    cmd_cancel,
    cmd_dlq,
    cmd_inspect,
    cmd_outbox,
    cmd_pause,
    cmd_redrive,
    cmd_replay,
    cmd_run,
    cmd_status,
    cmd_topics,
)
from streamsched.ops.cli.common import (
    DEFAULT_DATA_DIR,
    EXIT_CODES,
    check_environment,
    connect,
    early_signal,
    load_app,
    report_failure,
    version_text,
)
from streamsched.ops.cli.events import cmd_emit, cmd_schedule, event_from_json
from streamsched.ops.cli.parser import build_parser

__all__ = ["DEFAULT_DATA_DIR", "EXIT_CODES", "build_parser", "cmd_acl", "cmd_broker", "cmd_cancel", "cmd_dlq",
           "cmd_emit", "cmd_inspect", "cmd_outbox", "cmd_pause", "cmd_redrive", "cmd_replay", "cmd_run",
           "cmd_schedule", "cmd_status", "cmd_topics", "connect", "event_from_json", "load_app", "main",
           "report_failure", "version_text"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_environment(args)
    except Exception as exc:  # noqa: BLE001 - a bad variable is one line and an exit code
        return report_failure(exc)
    if os.environ.get("STREAMSCHED_LOG", "").upper() != "DEBUG":
        # aiokafka's per-address bootstrap ERRORs: held, and named in our one-line error instead.
        clientlog.install_bootstrap()
    if args.fn is cmd_run or (args.fn is cmd_schedule and args.action == "tick"):
        # A SIGTERM or SIGINT that arrives while the worker is still importing must mean "stop
        # cleanly", not dying mid-start (or a KeyboardInterrupt traceback); a second one exits.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, early_signal)
    try:
        return int(args.fn(args))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        return report_failure(exc)


if __name__ == "__main__":
    sys.exit(main())
