"""`streamsched replay`: reset a scheduler group's offsets for recovery, and prove a replay runs nothing new.

Real broker, real worker processes (the due_runs reference workflow and its SQLite ledger, whose
``calls`` table records every execution of the command, accepted or not), and Kafka's own
``kafka-consumer-groups`` (ConsumerGroupCommand from the kafka-tools jar) as the reference the
reset must agree with.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.harness import Workflow, build_events, claim_history, create_topics, produce, seeded_workflow
from consumers.ledger import Ledger
from streamsched.errors import ConfigError
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.model.claims import ClaimStatus
from streamsched.ops.replay import (
    PartitionReset,
    Target,
    consumer_groups_command,
    group_state,
    parse_offsets,
    parse_target,
    parse_time,
    plan_reset,
)
from streamsched.ops.replay_verify import LONG_RANGE, IdentityReplay, progress_bar
from streamsched.testing import WorkerProcess, make_event, wait_drained, wait_for

ROOT = Path(__file__).resolve().parents[2]
WORKER_ENV = {"STREAMSCHED_SESSION_TIMEOUT": "3s", "STREAMSCHED_HEARTBEAT": "0.5s",
              "STREAMSCHED_COMMIT_INTERVAL": "0s"}


# --- pure: parsing and arithmetic --------------------------------------------------------------------

def test_parse_offsets_and_time() -> None:
    assert parse_offsets("0:15, 1:7") == {0: 15, 1: 7}
    for bad in ("0", "a:1", "0:-1", "0:1,0:2"):
        with pytest.raises(ConfigError):
            parse_offsets(bad)
    assert parse_time("2025-01-31T12:00:00Z") == parse_time("2025-01-31T13:00:00+01:00") == 1738324800000
    assert parse_time("2025-01-31T12:00:00.123") == 1738324800123  # no offset: UTC
    with pytest.raises(ConfigError):
        parse_time("yesterday")
    with pytest.raises(ConfigError):
        parse_target(earliest=True, at="2025-01-31T12:00:00Z")
    assert parse_target(offsets="1:2") == Target("offset", offsets={1: 2})


def test_reread_counts_only_consumed_records() -> None:
    p = PartitionReset(0, committed=80, earliest=0, end=100, new_offset=30)
    assert (p.records, p.reread) == (70, 50)
    assert PartitionReset(0, committed=None, earliest=0, end=10, new_offset=0).reread == 0


def test_an_outcome_past_the_horizon_counts_as_a_new_effect() -> None:
    assert not IdentityReplay("sched_a", 0, outcome="SUCCEEDED").would_execute
    assert IdentityReplay("sched_a", 0, outcome="SUCCEEDED", expired=True).would_execute  # tombstoned soon
    assert IdentityReplay("sched_a", 0).would_execute


def test_progress_draws_a_bar_on_long_ranges_only(capsys: pytest.CaptureFixture[str]) -> None:
    meter = progress_bar(4, enabled=True)
    meter.update(4)
    meter.close()
    err = capsys.readouterr().err
    assert "replay verify" in err and "4/4" in err and "100%" in err
    quiet = progress_bar(4)  # a short range: no progress by default
    quiet.update(4)
    quiet.close()
    assert capsys.readouterr().err == ""
    long = progress_bar(LONG_RANGE, stream=io.StringIO())
    assert not long.disable
    long.close()


# --- helpers -----------------------------------------------------------------------------------------

async def cli(wf: Workflow, bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``streamsched replay`` as a user runs it (the app's names come from its environment)."""
    cmd = [sys.executable, "-m", "streamsched", "replay", "--app", wf.app_ref, "--bootstrap", bootstrap,
           *args]
    env = {**os.environ, **wf.env}
    return await asyncio.to_thread(subprocess.run, cmd, env=env, cwd=ROOT, capture_output=True,
                                   text=True, timeout=180)


async def kafka_tool(bootstrap: str, *args: str) -> str:
    proc = await asyncio.to_thread(subprocess.run, consumer_groups_command(bootstrap, *args),
                                   capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return proc.stdout


def tool_offsets(out: str, group: str, topic: str) -> dict[int, int]:
    """partition -> offset from the tool's table (NEW-OFFSET of a reset, CURRENT-OFFSET of --describe)."""
    rows = re.findall(rf"{re.escape(group)}\s+{re.escape(topic)}\s+(\d+)\s+(\d+)", out)
    return {int(p): int(o) for p, o in rows}


async def run_to_completion(wf: Workflow, bootstrap: str, log: Path) -> None:
    worker = WorkerProcess(wf.app_ref, bootstrap, env={**WORKER_ENV, **wf.env}, log_path=log).start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
    finally:
        assert worker.terminate() == 0, worker.log_tail()


def calls(wf: Workflow) -> int:
    """Every execution of the command so far (the ledger logs each call, accepted or not)."""
    return len(Ledger(wf.ledger).calls())


async def claims_per_identity(bootstrap: str, wf: Workflow) -> Counter[str]:
    """How many times each identity was claimed (one CLAIMED snapshot per turn that read it)."""
    history = await claim_history(bootstrap, wf)
    return Counter({i: sum(1 for s in states if s.status is ClaimStatus.CLAIMED)
                    for i, states in history.items()})


# --- real broker ---------------------------------------------------------------------------------------

async def test_replay_from_earliest_after_a_complete_run_executes_nothing(bootstrap: str,
                                                                          tmp_path: Path) -> None:
    wf, events = await seeded_workflow(bootstrap, "due_runs", "rp", tmp_path, partitions=2,
                                       unique=20, duplicates=10, noise=3)
    await run_to_completion(wf, bootstrap, tmp_path / "first.log")
    executed = calls(wf)
    assert executed == 20 and len(Ledger(wf.ledger).effects()) == 20

    verified = await cli(wf, bootstrap, "--verify", "--to-earliest", "--per-identity")
    assert verified.returncode == 0, verified.stderr
    lines = [json.loads(line) for line in verified.stdout.splitlines()]
    summary, per_identity = lines[-1], lines[:-1]
    assert summary["records"] == len(events) and summary["not_selected"] == 3
    assert summary["identities"] == summary["resolved"] == 20
    assert summary["expected_new_effects"] == 0 and summary["would_execute"] == []
    assert summary["committed"] is False
    assert len(per_identity) == 20 and not any(i["would_execute"] for i in per_identity)
    assert {i["identity"] for i in per_identity} == {wf.identity(e) for e in events if e.type == "due"}
    assert (await group_lag(bootstrap, wf.group, wf.topic)).total == 0, "verify must not commit"

    # Kafka's tool and ours agree on the reset; ours then moves the offsets (the tool shows them).
    tool = tool_offsets(await kafka_tool(bootstrap, "--group", wf.group, "--topic", wf.topic,
                                         "--reset-offsets", "--to-earliest", "--dry-run"), wf.group, wf.topic)
    reset = await cli(wf, bootstrap, "--to-earliest")
    assert reset.returncode == 0, reset.stderr
    plan = json.loads(reset.stdout)
    assert plan["executed"] is True and plan["records"] == plan["reread"] == len(events)
    assert {p["partition"]: p["new_offset"] for p in plan["partitions"]} == tool == {0: 0, 1: 0}
    shown = reset.stderr.strip().splitlines()  # one line per partition: how much it reads again
    assert len(shown) == 2 and all("record(s) to read" in line for line in shown), reset.stderr
    described = await kafka_tool(bootstrap, "--group", wf.group, "--describe")
    assert tool_offsets(described, wf.group, wf.topic) == tool

    # Workers run over the whole topic again: every identity is claimed again, none executes.
    before = await claims_per_identity(bootstrap, wf)
    await run_to_completion(wf, bootstrap, tmp_path / "replay.log")
    after = await claims_per_identity(bootstrap, wf)
    assert set(after) == set(before) and len(after) == 20
    assert all(after[i] > before[i] for i in before), "the replay did not re-read every identity"
    assert calls(wf) == executed, "a replay after a complete run executed something"
    assert len(Ledger(wf.ledger).effects()) == 20


async def test_replay_from_a_time_rereads_only_later_records(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".rpt-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=2)
    early = [make_event("due", "t", [f"early-{i}"], due_ns=1) for i in range(12)]
    await produce(bootstrap, wf, early)
    cut_ms = max(r.timestamp for r in await read_topic(bootstrap, wf.topic)) + 1

    async def past_cut() -> bool:
        return time.time_ns() // 1_000_000 > cut_ms

    await wait_for(past_cut, timeout=5, interval=0.001, what="the clock to pass the cut")
    late = [make_event("due", "t", [f"late-{i}"], due_ns=1) for i in range(8)]
    await produce(bootstrap, wf, late)
    await run_to_completion(wf, bootstrap, tmp_path / "first.log")
    executed = calls(wf)
    assert executed == 20

    at = datetime.fromtimestamp(cut_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    verified = await cli(wf, bootstrap, "--verify", "--to-time", at)
    assert verified.returncode == 0, verified.stderr
    summary = json.loads(verified.stdout)
    assert summary["records"] == summary["identities"] == summary["resolved"] == len(late)
    assert summary["expected_new_effects"] == 0

    # Same offsets as the tool's --to-datetime, and as its --from-file for explicit offsets.
    tool = tool_offsets(await kafka_tool(bootstrap, "--group", wf.group, "--topic", wf.topic,
                                         "--reset-offsets", "--to-datetime", at, "--dry-run"),
                        wf.group, wf.topic)
    ours = await plan_reset(bootstrap, wf.group, wf.topic, Target("time", time_ms=cut_ms))
    assert ours.offsets() == tool
    csv = tmp_path / "offsets.csv"
    csv.write_text(f"{wf.topic},0,3\n{wf.topic},1,100000\n")
    by_file = tool_offsets(await kafka_tool(bootstrap, "--group", wf.group, "--reset-offsets", "--from-file",
                                            str(csv), "--dry-run"), wf.group, wf.topic)
    explicit = await plan_reset(bootstrap, wf.group, wf.topic, Target("offset", offsets={0: 3, 1: 100000}))
    assert explicit.offsets() == by_file and explicit.partitions[1].clamped

    reset = await cli(wf, bootstrap, "--to-time", at)
    assert reset.returncode == 0, reset.stderr
    plan = json.loads(reset.stdout)
    assert plan["records"] == plan["reread"] == len(late)
    described = await kafka_tool(bootstrap, "--group", wf.group, "--describe")
    assert tool_offsets(described, wf.group, wf.topic) == tool

    before = await claims_per_identity(bootstrap, wf)
    await run_to_completion(wf, bootstrap, tmp_path / "replay.log")
    after = await claims_per_identity(bootstrap, wf)
    early_ids, late_ids = {wf.identity(e) for e in early}, {wf.identity(e) for e in late}
    assert all(after[i] == before[i] for i in early_ids), "records before the time were read again"
    assert all(after[i] > before[i] for i in late_ids), "records after the time were not read again"
    assert calls(wf) == executed


async def test_replay_is_refused_while_the_group_has_members(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".rpm-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=2)
    await produce(bootstrap, wf, build_events(wf, unique=6, duplicates=0))
    assert await group_state(bootstrap, wf.group) == ("Dead", 0)  # a group that never existed
    worker = WorkerProcess(wf.app_ref, bootstrap, env={**WORKER_ENV, **wf.env},
                           log_path=tmp_path / "w.log").start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)

        async def member() -> bool:
            return (await group_state(bootstrap, wf.group))[1] == 1

        await wait_for(member, timeout=30, what="the worker to be a group member")
        committed = (await group_lag(bootstrap, wf.group, wf.topic)).committed
        refused = await cli(wf, bootstrap, "--to-earliest")
        assert refused.returncode == 2 and refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "ReplayRefused" in refused.stderr and "1 active member" in refused.stderr
        assert (await group_lag(bootstrap, wf.group, wf.topic)).committed == committed
    finally:
        assert worker.terminate() == 0
    assert (await group_state(bootstrap, wf.group))[1] == 0
    dry = await cli(wf, bootstrap, "--to-earliest", "--dry-run")  # no members: allowed, commits nothing
    assert dry.returncode == 0 and json.loads(dry.stdout)["executed"] is False
    assert (await group_lag(bootstrap, wf.group, wf.topic)).total == 0
