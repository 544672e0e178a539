"""Crash-test failpoints, free when off.

``STREAMSCHED_FAILPOINT=after_claim:3`` makes the process SIGKILL itself the third time it passes
``after_claim``; ``after_claim:3:stop`` makes it SIGSTOP itself there instead (a zombie frozen at
that point, for a test to resume with SIGCONT). The check is one global lookup when no failpoint
is set, so the hooks stay in the hot path of every turn.
"""

from __future__ import annotations

import os
import signal

from streamsched.errors import ConfigError

POINTS = (
    "after_select",
    "after_claim",
    "after_effect",
    "after_outcome",
    "after_release",
    "after_commit",
)
"""The worker turn's crash boundaries."""
TICKER_POINTS = ("tick_before_commit", "tick_after_commit")
"""Just before and just after a schedule ticker's fire-and-advance transaction commits."""
OUTBOX_POINTS = ("outbox_after_send",)
"""The outbox relay: after the Kafka send, before the intent is deleted."""

ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
"""What a failpoint does to its process when it is reached (``kill`` unless said)."""

_armed: dict[str, tuple[int, signal.Signals]] | None = None


def parse(spec: str) -> dict[str, tuple[int, signal.Signals]]:
    """``name[:nth[:action]][,...]`` as {name: (nth, signal)}; a :class:`ConfigError` naming the
    variable otherwise (a typo in a crash drill is one line, not an import-time traceback)."""
    armed: dict[str, tuple[int, signal.Signals]] = {}
    known = POINTS + TICKER_POINTS + OUTBOX_POINTS
    form = f"name[:nth[:{'|'.join(ACTIONS)}]][,...]"
    for item in spec.split(","):
        name, _, rest = item.strip().partition(":")
        nth, _, action = rest.partition(":")
        if name not in known:
            raise ConfigError(f"STREAMSCHED_FAILPOINT must be {form} of known "
                              f"failpoints ({', '.join(known)}), not {name!r}")
        if nth and not (nth.isdigit() and int(nth) >= 1):
            raise ConfigError(f"STREAMSCHED_FAILPOINT must be {form} with nth >= 1")
        if action and action not in ACTIONS:
            raise ConfigError(f"STREAMSCHED_FAILPOINT must be {form}, not action {action!r}")
        armed[name] = (int(nth or 1), ACTIONS[action or "kill"])
    return armed


def arm(spec: str | None) -> None:
    """Arm failpoints from ``name[:nth[:action]][,...]`` (None or "" disarms)."""
    global _armed
    _armed = parse(spec) if spec else None


def hit(name: str) -> None:
    if _armed is None:
        return
    armed = _armed.get(name)
    if armed is None:
        return
    left, sig = armed
    if left <= 1:
        _armed.pop(name)  # a stopped process resumed goes on past it
        os.kill(os.getpid(), sig)
        return
    _armed[name] = (left - 1, sig)


arm(os.environ.get("STREAMSCHED_FAILPOINT"))
