"""Restore progress (streamsched/kafka/progress.py): the gauges and the throttled log line every
restore of a partition reports, whichever store or runtime restores it."""

from __future__ import annotations

import logging

import pytest


def test_restore_progress_is_a_gauge_and_a_log_line_every_few_seconds(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from streamsched.kafka import progress as restore_progress
    from streamsched.metrics import Metrics

    now = [100.0]
    monkeypatch.setattr(restore_progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger=restore_progress.__name__)
    metrics = Metrics("s")
    progress = restore_progress.Progress(metrics, "__streamsched.state.s", 3, 1000, 9000, "cold")
    assert metrics.gauges["restore_remaining{partition=3}"] == 8000
    progress.page(4096, 5096)
    assert metrics.gauges["restore_remaining{partition=3}"] == 3904
    assert not caplog.records  # less than 5 s in: no line yet
    now[0] += 6
    progress.page(3904, 9000)
    assert metrics.gauges["restore_remaining{partition=3}"] == 0
    assert [r.getMessage() for r in caplog.records] == [
        "restoring __streamsched.state.s[3] (cold): offset 9000 of 9000 (100%), 8000 records in 6.0s"]
    assert progress.done() == 6.0
    assert metrics.counters["restores{kind=cold}"] == 1
    assert metrics.counters["restore_records{partition=3}"] == 8000
    assert caplog.records[-1].getMessage().startswith(
        "restored __streamsched.state.s[3] (cold) from offset 1000")
