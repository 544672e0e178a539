"""`make demo`: both reference workflows end to end on a fresh local Kafka, with a crash.

1. start a local KRaft broker (fresh data dir under .streamsched/demo), apply topics/;
2. emit a first wave of events (with duplicates) — two through the `streamsched emit` CLI;
3. run two `due_runs` workers and one `pipelines` worker as real processes;
4. SIGKILL one `due_runs` worker midway, emit the second wave, start a replacement;
5. wait until every consumer group has committed the whole topic, then audit from Kafka
   (read_committed) and the ledger: events, unique identities, effects, duplicates suppressed.

Exits 1 if for any workflow effects != unique identities (or fences did not increase).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from consumers.harness import Audit, Workflow, audit, build_events, produce  # noqa: E402
from streamsched.kafka.reads import group_lag  # noqa: E402
from streamsched.ops.broker import LocalCluster  # noqa: E402
from streamsched.testing import WorkerProcess, wait_drained, wait_for  # noqa: E402

DATA = ROOT / ".streamsched" / "demo"
ENV = {"STREAMSCHED_CLAIM_DURATION_S": "5", "STREAMSCHED_SESSION_TIMEOUT": "3s",
       "STREAMSCHED_HEARTBEAT": "0.5s",
       # Claims on disk, as `streamsched run` keeps them by default, beside the demo's broker.
       "STREAMSCHED_STORE_DIR": str(DATA / "stores")}


def cli(*args: str, bootstrap: str) -> str:
    cmd = [sys.executable, "-m", "streamsched", *args, "--bootstrap", bootstrap]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


async def demo(bootstrap: str) -> list[tuple[str, Audit]]:
    print(cli("topics", "apply", "--app", "consumers.due_runs:app", bootstrap=bootstrap))
    print(cli("topics", "apply", "--app", "consumers.pipelines:app", bootstrap=bootstrap))
    runs = Workflow("due_runs", "", DATA / "ledger.sqlite3")
    pipes = Workflow("pipelines", "", DATA / "ledger.sqlite3")
    plan = {wf.kind: build_events(wf, unique=200, duplicates=120, noise=20, seed=i)
            for i, wf in enumerate((runs, pipes))}
    half = {k: len(v) // 2 for k, v in plan.items()}

    for wf in (runs, pipes):
        await produce(bootstrap, wf, plan[wf.kind][: half[wf.kind]])
    # Services in any language publish the same way; here two events go through the CLI.
    doc = {"type": "due", "tenant": "tenant-0", "target": ["due_runs-0"], "due_ns": 1_700_000_000 * 10**9}
    print("emit:", cli("emit", runs.topic, "--event", json.dumps(doc), bootstrap=bootstrap))
    print("emit:", cli("emit", runs.topic, "--event", json.dumps(doc), bootstrap=bootstrap))
    extra = [e for e in plan["due_runs"] if e.target == ("due_runs-0",)][:1]
    logs = DATA / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**ENV, "STREAMSCHED_LEDGER": str(runs.ledger), "STREAMSCHED_LEDGER_LATENCY_S": "0.01"}
    workers = {
        "due_runs-a": WorkerProcess(runs.app_ref, bootstrap, env=env, log_path=logs / "due_runs-a.log"),
        "due_runs-b": WorkerProcess(runs.app_ref, bootstrap, env=env, log_path=logs / "due_runs-b.log"),
        "pipelines-a": WorkerProcess(pipes.app_ref, bootstrap, env=env, log_path=logs / "pipelines-a.log"),
    }
    for w in workers.values():
        w.start()
    try:
        async def some_progress() -> bool:
            lag = await group_lag(bootstrap, runs.group, runs.topic)
            return sum(lag.committed.values()) >= 40

        await wait_for(some_progress, timeout=120, what="due_runs to make progress")
        victim = workers["due_runs-a"]
        victim.signal(signal.SIGKILL)
        print(f"SIGKILLed due_runs worker pid {victim.pid} midway")
        for wf in (runs, pipes):
            await produce(bootstrap, wf, plan[wf.kind][half[wf.kind]:])
        workers["due_runs-c"] = WorkerProcess(runs.app_ref, bootstrap, env=env,
                                              log_path=logs / "due_runs-c.log").start()
        print("restarted a due_runs worker")
        for wf in (runs, pipes):
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=180)
    finally:
        for w in workers.values():
            if w.alive():
                w.terminate()
    results = [("due_runs", await audit(bootstrap, runs, plan["due_runs"] + extra + extra)),
               ("pipelines", await audit(bootstrap, pipes, plan["pipelines"]))]
    await schedule_demo(bootstrap, env, logs)
    return results


async def schedule_demo(bootstrap: str, env: dict[str, str], logs: Path) -> None:
    """A durable schedule firing into the `reports` scheduler, and its history."""
    from streamsched.kafka.reads import read_topic
    from streamsched.model.jsonval import json_loads
    from streamsched.schedules.catalog import Catalog

    print(cli("topics", "apply", "--app", "consumers.reports:app", bootstrap=bootstrap))
    catalog = Catalog(bootstrap, "demo", partitions=2)
    await catalog.ensure_topics()
    print("schedule:", cli("schedule", "add", "report-every-second", "@every 1s", "--target",
                           "reports.transitions", "--type", "report", "--catalog", "demo",
                           "--partitions", "2", bootstrap=bootstrap))
    procs = [WorkerProcess("", bootstrap, env=env, log_path=logs / "ticker.log",
                           command=["schedule", "tick", "--catalog", "demo", "--partitions", "2"]),
             WorkerProcess("consumers.reports:app", bootstrap, env=env, log_path=logs / "reports.log")]
    for p in procs:
        p.start()
    try:
        async def three_succeeded() -> bool:
            rows = await catalog.history("report-every-second")
            return sum(r.state == "SUCCEEDED" for r in rows) >= 3

        await wait_for(three_succeeded, timeout=90, what="three scheduled reports")
    finally:
        for p in procs:
            p.terminate()
    print(cli("schedule", "list", "--catalog", "demo", bootstrap=bootstrap))
    print(cli("schedule", "history", "report-every-second", "--catalog", "demo", bootstrap=bootstrap))
    published = [json_loads(r.value) for r in await read_topic(bootstrap, "reports.events")]
    keys = [d["idempotency_key"] for d in published if isinstance(d, dict)]
    succeeded = sum(r.state == "SUCCEEDED" for r in await catalog.history("report-every-second"))
    print(f"scheduled reports published: {len(keys)} (unique {len(set(keys))}), "
          f"history SUCCEEDED rows: {succeeded}")
    if len(keys) != len(set(keys)) or len(keys) < succeeded:
        raise SystemExit("schedule demo: an occurrence was published twice or not at all")


def main() -> int:
    # aiokafka logs transient coordinator lookups at ERROR while the fresh broker warms up.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    if DATA.exists():
        shutil.rmtree(DATA)
    cluster = LocalCluster(data_dir=DATA / "broker")
    t0 = time.monotonic()
    bootstrap = cluster.start()
    print(f"local Kafka (KRaft) at {bootstrap}, started in {time.monotonic() - t0:.1f}s")
    try:
        results = asyncio.run(demo(bootstrap))
    finally:
        cluster.stop()
    header = (f"{'workflow':<10} {'events':>7} {'selected':>8} {'unique':>7} {'effects':>8} "
              f"{'dups suppressed':>16}  ok")
    print(header)
    ok = True
    for name, a in results:
        print(f"{name:<10} {a.events:>7} {a.selected:>8} {a.unique:>7} {a.effects:>8} "
              f"{a.duplicates_suppressed:>16}  {'yes' if a.ok else 'NO'}")
        ok &= a.ok
    print("counts agree" if ok else "COUNTS DISAGREE", f"({time.monotonic() - t0:.1f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
