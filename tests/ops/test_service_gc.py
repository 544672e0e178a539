"""A service process (worker, ticker, relay) runs with the cyclic collector's thresholds raised,
and a caller in the same process gets its own thresholds back."""

from __future__ import annotations

import gc

from streamsched.ops.cli.common import SERVICE_GC_THRESHOLD, run_service


def test_a_service_runs_with_raised_collector_thresholds_and_restores_them() -> None:
    before = gc.get_threshold()
    assert before != SERVICE_GC_THRESHOLD
    seen: list[tuple[int, int, int]] = []

    async def main() -> None:
        seen.append(gc.get_threshold())

    assert run_service(main) == 0
    assert seen == [SERVICE_GC_THRESHOLD]
    assert gc.get_threshold() == before
