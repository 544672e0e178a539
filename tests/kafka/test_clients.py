"""The client factory: clients refresh metadata within seconds, not aiokafka's 300 s (defect 4o)."""

from __future__ import annotations

from typing import Any

from streamsched.kafka import clients


def _max_age_ms(client: Any) -> int:
    inner = client.client if hasattr(client, "client") else client._client  # producer / consumer
    return int(inner._metadata_max_age_ms)


async def test_consumers_and_producers_refresh_metadata_within_seconds() -> None:
    built = [clients.consumer("127.0.0.1:1"), clients.consumer("127.0.0.1:1", group_id="g"),
             clients.producer("127.0.0.1:1"), clients.transactional_producer("127.0.0.1:1", "tx"),
             clients.consumer("127.0.0.1:1", metadata_max_age_ms=20_000)]
    try:
        assert [_max_age_ms(c) for c in built] == [clients.METADATA_MAX_AGE_MS] * 4 + [20_000]
        assert clients.METADATA_MAX_AGE_MS <= 10_000
    finally:
        for c in built:
            await c.stop()
