"""The scheduler worker: the App API, the six-step turn and the consumer-group member.

Lives here: ``app`` (App, SchedulerDef, selections, commands, handler context), ``store``
(per-partition claim state), ``offsets`` (pure commit watermarks), ``turn`` (select -> claim
-> execute -> resolve), ``execute`` (handler + retry decision), ``duework`` (the bounded due
index), ``intake`` (the consumer-group member feeding partitions).

May import: ``model``, ``wire``, ``kafka``, ``errors``, ``metrics``, ``failpoints``. Never
``streamsched.schedules`` or ``ops``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamsched.worker.intake import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing streamsched.worker.app does not pull in the consumer runtime.
    if name in __all__:
        from streamsched.worker import intake

        return getattr(intake, name)
    raise AttributeError(f"module 'streamsched.worker' has no attribute {name!r}")
