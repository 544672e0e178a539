"""streamsched: durable workflow schedulers on Apache Kafka.

Exactly one business effect per stable identity across crashes, rebalances and zombie workers;
delivery is at-least-once, effects are idempotent. See docs/concepts.md for the concepts.

Exports are resolved lazily so that ``streamsched`` commands (and a worker's signal handling)
start before aiokafka is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamsched.errors import StreamschedError
    from streamsched.kafka.producer import Producer, RecordMetadata
    from streamsched.model.breaker import BreakerOpen, BreakerPolicy
    from streamsched.model.event import TransitionEvent
    from streamsched.model.retry import Retryable, RetryPolicy, Terminal
    from streamsched.worker.app import (
        App,
        CommandContext,
        Emit,
        ExternalCommand,
        KafkaCommand,
        Selection,
        Turn,
        external_command,
        kafka_command,
    )
    from streamsched.worker.intake import Worker, WorkerConfig

_EXPORTS = {
    "App": "worker.app", "CommandContext": "worker.app", "Emit": "worker.app",
    "ExternalCommand": "worker.app", "KafkaCommand": "worker.app", "Selection": "worker.app",
    "Turn": "worker.app", "external_command": "worker.app", "kafka_command": "worker.app",
    "TransitionEvent": "model.event", "StreamschedError": "errors",
    "RetryPolicy": "model.retry", "Retryable": "model.retry", "Terminal": "model.retry",
    "BreakerPolicy": "model.breaker", "BreakerOpen": "model.breaker",
    "Worker": "worker.intake", "WorkerConfig": "worker.intake",
    "Producer": "kafka.producer", "RecordMetadata": "kafka.producer",
}

__all__ = [
    "App",
    "BreakerOpen",
    "BreakerPolicy",
    "CommandContext",
    "Emit",
    "ExternalCommand",
    "KafkaCommand",
    "Producer",
    "RecordMetadata",
    "RetryPolicy",
    "Retryable",
    "Selection",
    "StreamschedError",
    "Terminal",
    "TransitionEvent",
    "Turn",
    "Worker",
    "WorkerConfig",
    "external_command",
    "kafka_command",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamsched' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
