"""Operations: the CLI, the local Kafka runner, dead-letter tools and status/metrics.

May import everything below it (``model``, ``wire``, ``kafka``, ``worker``, ``schedules``).
Nothing below imports ``ops``.
"""
