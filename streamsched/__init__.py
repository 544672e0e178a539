"""streamsched: durable workflow schedulers on Apache Kafka.

Exactly one business effect per stable identity across crashes, rebalances and zombie workers;
delivery is at-least-once, effects are idempotent. See README.md for the concepts.
"""

from .app import (
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
from .codecs import TransitionEvent
from .errors import StreamschedError
from .worker import Worker, WorkerConfig

__all__ = [
    "App",
    "CommandContext",
    "Emit",
    "ExternalCommand",
    "KafkaCommand",
    "Selection",
    "StreamschedError",
    "TransitionEvent",
    "Turn",
    "Worker",
    "WorkerConfig",
    "external_command",
    "kafka_command",
]

__version__ = "0.1.0"
