"""Crash-test failpoints, free when off.

``STREAMSCHED_FAILPOINT=after_claim:3`` makes the process SIGKILL itself the third time it passes
``after_claim``. The check is one global lookup when no failpoint is set, so the hooks stay in
the hot path of every turn.
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

_armed: dict[str, int] | None = None


def parse(spec: str) -> dict[str, int]:
    """``name[:nth][,name[:nth]]`` as {name: nth}; a :class:`ConfigError` naming the variable
    otherwise (a typo in a crash drill is one line, not an import-time traceback)."""
    armed: dict[str, int] = {}
    known = POINTS + TICKER_POINTS + OUTBOX_POINTS
    for item in spec.split(","):
        name, _, nth = item.strip().partition(":")
        if name not in known:
            raise ConfigError(f"STREAMSCHED_FAILPOINT must be name[:nth][,name[:nth]...] of known "
                              f"failpoints ({', '.join(known)}), not {name!r}")
        if nth and not (nth.isdigit() and int(nth) >= 1):
            raise ConfigError("STREAMSCHED_FAILPOINT must be name[:nth][,name[:nth]...] with nth >= 1")
        armed[name] = int(nth or 1)
    return armed


def arm(spec: str | None) -> None:
    """Arm failpoints from ``name[:nth][,name[:nth]]`` (None or "" disarms)."""
    global _armed
    _armed = parse(spec) if spec else None


def hit(name: str) -> None:
    if _armed is None:
        return
    left = _armed.get(name)
    if left is None:
        return
    if left <= 1:
        os.kill(os.getpid(), signal.SIGKILL)
    _armed[name] = left - 1


arm(os.environ.get("STREAMSCHED_FAILPOINT"))
