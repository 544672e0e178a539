"""What every ``streamsched`` command shares: the connection, the app loader, signal handling
for long-running services, the status server, the version line, and the one-line failure report
with its exit code (:data:`EXIT_CODES`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamsched.errors import ConfigError, RegistryUnavailable, StreamschedError

if TYPE_CHECKING:
    from streamsched.kafka.clients import Connection
    from streamsched.worker.app import App

DEFAULT_DATA_DIR = Path(".streamsched/broker")
_early_stop: list[int] = []
"""Signals received before a worker's event loop took them over (see main)."""


def connect(args: argparse.Namespace) -> Connection:
    """The command's :class:`~streamsched.kafka.clients.Connection` from its connection flags,
    STREAMSCHED_* variables and --config file (:mod:`streamsched.ops.config`)."""
    from streamsched.ops.config import resolve_connection

    return resolve_connection(args)


def load_app(ref: str) -> App:
    """The app ``MODULE:ATTR`` names (the working directory is importable), or a one-line
    :class:`ConfigError` saying what is wrong with the reference: never an import traceback."""
    from streamsched.ops.config import import_ref
    from streamsched.worker.app import App

    app = import_ref(ref, "the app")
    if not isinstance(app, App):
        raise ConfigError(f"{ref} is a {type(app).__name__}, not a streamsched.App")
    return app


def stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGTERM/SIGINT (drain, commit, leave the group); a second one
    cancels the running main task: stop at once, without draining. Signals that arrived while
    the process was starting (see :func:`early_signal`) count."""
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


def early_signal(signum: int, _frame: object) -> None:
    """SIGTERM/SIGINT before the event loop took them over (or after it closed): the first one
    means "stop cleanly" (no KeyboardInterrupt traceback), a second one exits at once."""
    _early_stop.append(signum)
    if len(_early_stop) > 1:
        raise SystemExit(128 + signum)


SERVICE_GC_THRESHOLD = (100_000, 50, 100)
"""The cyclic collector's thresholds in a service process (CPython's are 700, 10, 10). Why: a
worker allocates several container objects per item and keeps many alive (clients, stores,
metrics), so young collections ran every few items and full ones often; measured with
bench/turns.py (60,000 records, one round each, same broker): the Kafka-native worker spent 0.153
ms of CPU per item with these thresholds and 0.220 with the defaults (5,595 and 4,038 items/s);
the claim-first workload was unchanged (0.308 and 0.309). Garbage without cycles is freed by
reference counting either way; what waits longer is cyclic garbage, at most one young
generation of it."""


def run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> int:
    """``asyncio.run(main())`` for a worker or ticker whose ``main`` uses :func:`stop_on_signals`:
    0 after a clean drain, 128 + the signal number when a second signal stopped it at once."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*SERVICE_GC_THRESHOLD)
    early = signal.getsignal(signal.SIGINT) is early_signal  # started through main()
    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        return 128 + (_early_stop[-1] if _early_stop else signal.SIGTERM)
    finally:
        gc.set_threshold(*thresholds)  # a caller in the same process (tests) gets its own back
        if early:  # asyncio restored the defaults when its loop closed: a late signal stays quiet
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, early_signal)
    return 0


def configure_logging() -> None:
    """``STREAMSCHED_LOG`` (level) and ``STREAMSCHED_LOG_FORMAT`` (text or json): :mod:`streamsched.logs`."""
    from streamsched import logs

    logs.configure()


async def serve_status(stack: contextlib.AsyncExitStack, args: argparse.Namespace, metrics: list[Any],
                        ready: Any) -> None:
    """Serve /metrics, /status, /healthz and /readyz on --status-host:--status-port until ``stack`` closes."""
    if args.status_port is None:
        return
    from streamsched.ops.status import StatusServer

    server = await stack.enter_async_context(
        StatusServer(metrics, host=args.status_host, port=args.status_port, ready=ready))
    print(json.dumps({"status_url": server.url}), file=sys.stderr, flush=True)


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


EXIT_CODES = """\
exit codes:
  0      success
  1      the answer is no: `broker status` of a stopped broker, `status` with no server
         answering, `schedule rm|enable|disable` of a schedule that does not exist
  2      usage or configuration error, or input refused (a bad flag, MODULE:ATTR, event,
         topic definition or drift): nothing was sent
  3      Kafka or the schema registry is unreachable or refused the request
  4      a worker, ticker or relay stopped on an unexpected error
  128+N  stopped at once by a second signal N (130: two Ctrl-C, 143: two SIGTERMs)
every failure is one line on stderr ("streamsched: ..."); STREAMSCHED_LOG=DEBUG adds the traceback
"""


def check_environment(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> None:
    """The set ``STREAMSCHED_*`` variables the command of ``args`` reads (all of them without
    ``args``), checked against their declaration (:mod:`streamsched.settings`) before it starts:
    a bad value is a :class:`ConfigError` naming the variable (never a secret's value), not a
    traceback or exit 4 later in a worker. A variable only other commands read is left alone."""
    from streamsched import settings

    if args is None:
        settings.check(env)
        return
    words = " ".join(str(w) for w in (getattr(args, "command", None), getattr(args, "action", None)) if w)
    # The connection flags' presence says the command talks to Kafka; `acl plan` does with --config.
    connects = hasattr(args, "bootstrap") or getattr(args, "config", None) is not None
    settings.check(env, command=words, connects=connects)


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
        return 3 if isinstance(ours[0], RegistryUnavailable) else 2
    broken_pipe = any(isinstance(e, BrokenPipeError) for e in leaves)
    if broken_pipe and not any(isinstance(e, KafkaError) for e in leaves):
        # The reader of our output went away (`streamsched ... | head`): like any Unix tool, stop
        # quietly; stdout is pointed at /dev/null so the interpreter's final flush cannot fail too.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    unreachable = KafkaError | ConnectionError | TimeoutError | socket.gaierror
    kafka = [e for e in leaves if isinstance(e, unreachable)]
    if kafka:
        from streamsched.kafka import clientlog

        failed = clientlog.held()[:3]  # the bootstrap addresses aiokafka could not reach, and why
        where = f"; {', '.join(failed)}" if failed else ""
        print(f"streamsched: Kafka is unreachable or refused the request ({type(kafka[0]).__name__}{where})",
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
