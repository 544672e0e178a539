"""A schedule's overlap policy: what happens to a boundary while its previous run has not resolved.

Pure. The ticker (:func:`streamsched.schedules.plan.fire_due`) asks :func:`admit` which due
boundaries fire, and tells :func:`resolved` when a target worker reports an occurrence's
terminal result (the catalog's feedback, :mod:`streamsched.schedules.feedback`):

* ``allow`` (the default): every boundary fires, whatever still runs. Nothing is tracked.
* ``skip``: a boundary due while the last fired occurrence has no result yet does not fire. It
  is counted as skipped, and the first skip of each run gets a ``SKIPPED`` history row (not one
  per boundary: a schedule firing every second behind an hour-long run would otherwise push
  every real row out of its 256 slots).
* ``buffer_one``: the first boundary due while a run is unresolved is held, and fires as soon
  as that run resolves (with its own planned time as its identity, so it is late, not new);
  further ones are skipped as under ``skip``.

Only the schedule's own boundaries count: a manual trigger or backfill neither waits for nor
holds back a scheduled run. A run is unresolved until its terminal result is reported; a retry
in backoff is still running. A target that never reports (no streamsched worker consumes it)
leaves a ``skip`` schedule waiting after its first run: such schedules keep ``allow``. A run
that will never report (cancelled by an operator, or its report dropped) is let go by pausing
and resuming the schedule: a resume forgets what was tracked (:data:`IDLE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, get_args

from streamsched.errors import ConfigError

Overlap = Literal["allow", "skip", "buffer_one"]
OVERLAPS: Final[tuple[str, ...]] = get_args(Overlap)


def check_overlap(value: str) -> Overlap:
    """``value`` as an :data:`Overlap`; :class:`ConfigError` naming the choices otherwise."""
    if value not in OVERLAPS:
        raise ConfigError(f"overlap must be one of {', '.join(OVERLAPS)}, not {value!r}")
    return value  # type: ignore[return-value]  # checked against the Literal's values above


@dataclass(frozen=True, slots=True)
class Running:
    """What a schedule under ``skip`` or ``buffer_one`` tracks of its runs."""

    pending_ns: int | None = None
    """Planned time of the last scheduled occurrence fired whose result is not reported yet."""
    buffered_ns: int | None = None
    """``buffer_one``: the boundary held until the pending run resolves."""
    skips: int = 0
    """Boundaries skipped since the pending run fired (its first skip gets a history row)."""

    @property
    def idle(self) -> bool:
        return self.pending_ns is None and self.buffered_ns is None and self.skips == 0


IDLE: Final = Running()


@dataclass(frozen=True, slots=True)
class Admitted:
    """Of a tick's due boundaries: which fire, which are skipped (with the first that gets a
    history row, if any), and what the schedule tracks afterwards."""

    fire: tuple[int, ...]
    skipped: tuple[int, ...]
    row: int | None
    """The skipped boundary that gets a ``SKIPPED`` history row, or None."""
    running: Running


def admit(policy: Overlap, running: Running, due: Sequence[int]) -> Admitted:
    """Which of ``due`` (ascending planned times) fire under ``policy``, given ``running``.

    Every due boundary is accounted for once: fired, buffered (held in the result's
    ``running``) or skipped."""
    if policy == "allow":
        return Admitted(tuple(due), (), None, running)
    fire: list[int] = []
    skipped: list[int] = []
    row: int | None = None
    pending, buffered, skips = running.pending_ns, running.buffered_ns, running.skips
    for t in due:
        if pending is None:
            fire.append(t)
            pending, skips = t, 0
        elif policy == "buffer_one" and buffered is None:
            buffered = t
        else:
            skipped.append(t)
            if skips == 0:
                row = t
            skips += 1
    return Admitted(tuple(fire), tuple(skipped), row, Running(pending, buffered, skips))


def resolved(running: Running, planned_ns: int) -> Running:
    """``running`` once the occurrence planned at ``planned_ns`` reported its terminal result:
    if it is the pending run, nothing is pending any more (a buffered boundary may fire); if it
    is the buffered boundary (a backfill ran it meanwhile), nothing is held any more: released
    later, it would resolve from its stored outcome without reporting, and be waited on forever."""
    if running.pending_ns == planned_ns:
        return replace(running, pending_ns=None, skips=0)
    if running.buffered_ns == planned_ns:
        return replace(running, buffered_ns=None)
    return running


def release(running: Running) -> tuple[int | None, Running]:
    """The buffered boundary to fire now (nothing pending), or None; and what is tracked then."""
    if running.pending_ns is not None or running.buffered_ns is None:
        return None, running
    return running.buffered_ns, Running(running.buffered_ns, None, 0)
