"""Cross-cluster disaster recovery, end to end: two clusters, a real MirrorMaker 2 between them, a
steady load on the primary, the primary lost abruptly (its broker and worker SIGKILLed), failover
to the secondary with the documented commands (``topics apply --source-*``, ``dr status``, ``dr
failover``, ``run`` against the secondary), and a drain there (:mod:`consumers.dr_drill`).

Audited from the external command's own call records (one SQLite ledger per cluster) and the
secondary's read_committed topics, never worker memory:

* nothing lost: every identity whose event is on the secondary has a SUCCEEDED outcome there;
* every identity called on both clusters is one whose outcome had not reached the secondary at
  the kill (read from the secondary right after it), and nothing else ran twice;
* every call carried its identity's idempotency key.

The mirror lags as one across regions does (fetches wait 1.5 s), so the kill usually leaves some
events and outcomes behind on the primary (its FAULT-RESULT line counts them; a run where the
mirror happened to have fetched everything still checks the rest). RPO and RTO figures are the
benchmark's (``bench/failover_dr.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from consumers.dr_drill import run_drill
from tests.faults.fault_logs import RestartBound, judge_logs

pytestmark = [pytest.mark.faults, pytest.mark.kafka]


async def test_failover_to_a_mirrored_cluster_loses_nothing_and_repeats_only_unmirrored_outcomes(
        tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    notes: list[str] = []
    report = await run_drill(tmp_path, load_s=12.0, after_s=6.0, log=notes.append)
    doc = json.dumps({"scenario": "dr_failover", **report.to_dict()}, sort_keys=True)
    print("FAULT-RESULT " + doc)
    record_property("fault_result", doc)
    where = f"{doc} {notes}"
    assert report.produced > 0, where
    assert report.lost == 0, where
    assert report.dup_outside_unmirrored == 0, where
    assert report.dup_unmirrored <= report.unmirrored_outcomes_at_kill, where
    assert report.keys_consistent, where
    assert report.status_behind_s is not None, where  # dr status read both clusters under load
    # The secondary's worker met a healthy cluster: its log is clean, no owner restarted.
    judge_logs({"worker-B": (tmp_path / "worker-B.log").read_text()},
               restarts=RestartBound(0, "the secondary never failed"))
