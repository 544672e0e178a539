"""Throughput of claim-first work whose command waits on I/O, against its in-flight bound.

A worker holds at most ``max_in_flight`` (8) unresolved claims per partition. With a command that
only waits (a call to a slow service), Little's law bounds a worker's rate at
``8 x partitions / mean latency``: every slot busy all the time. How close the worker comes shows
what the turn's own transactions and scheduling cost on top of the wait (a partition that waits
for the slowest item of a batch before claiming more keeps most slots idle).

Workloads (bench/io_bound_app.py): one worker process, ``--partitions`` (8) partitions, an
external command that sleeps ``--median-ms`` (20) constantly (``const``), and lognormally with
median ``--median-ms`` and 99th percentile ``--p99-ms`` (200; mean 32.6 ms) (``lognormal``).

Method (as bench/turns.py, whose helpers it uses): the input is produced first; a warm-up run of
each workload; then ``--rounds`` rounds of each, each a fresh scheduler (group, state topic) over
the same input; the harness polls the group's committed offsets every 25 ms and measures the rate
between 10 % and 90 % of the records committed. Figures are medians of the rounds.

Keys of the JSON on the last line: ``const_per_s``, ``lognormal_per_s``, ``bound_const_per_s``,
``bound_lognormal_per_s``, ``ratio_to_bound_const``, ``ratio_to_bound_lognormal`` (plus each
rate's ``*_range`` and the worker's CPU per item).

Usage: ``python bench/io_bound.py [--bootstrap HOST:PORT] [--records N] [--rounds R] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.io_bound_app import mean_latency_s  # noqa: E402
from bench.turns import (  # noqa: E402
    Measured,
    Offsets,
    Proc,
    input_topic,
    load_avg,
    log,
    measure,
    med,
    run_on_broker,
    tag,
)
from streamsched.testing import WorkerProcess  # noqa: E402


def start_worker(bootstrap: str, logdir: Path, topic: str, name: str, kind: str,
                 args: argparse.Namespace) -> Proc:
    env = {"BENCH_TOPIC": topic, "BENCH_NAME": name, "BENCH_LATENCY": kind,
           "BENCH_MEDIAN_MS": str(args.median_ms), "BENCH_P99_MS": str(args.p99_ms),
           "STREAMSCHED_STORE_DIR": os.environ.get("STREAMSCHED_STORE_DIR", str(logdir / "stores"))}
    w = WorkerProcess("bench.io_bound_app:app", bootstrap, env=env, log_path=logdir / f"{name}.log")
    return Proc(worker=w.start())


async def run_once(offsets: Offsets, bootstrap: str, broker_pid: int | None, logdir: Path, topic: str,
                   total: int, kind: str, args: argparse.Namespace) -> Measured:
    name = f"io{kind[0]}{tag()}"
    proc = start_worker(bootstrap, logdir, topic, name, kind, args)
    return await measure(offsets, proc, f"streamsched.{name}", topic, total, broker_pid,
                         timeout_s=total / 50 + 120)


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    started = load_avg()
    log(f"records={args.records} rounds={args.rounds} partitions={args.partitions} load={started}")
    result: dict[str, Any] = {"records": args.records, "rounds": args.rounds, "partitions": args.partitions,
                              "median_ms": args.median_ms, "p99_ms": args.p99_ms}
    async with Offsets(bootstrap) as offsets:
        warm = await input_topic(bootstrap, args.partitions, args.warmup)
        topic = await input_topic(bootstrap, args.partitions, args.records)
        for kind in ("const", "lognormal"):
            log(f"warm-up {kind}")
            await run_once(offsets, bootstrap, broker_pid, logdir, warm, args.warmup, kind, args)
        for kind in ("const", "lognormal"):
            runs = []
            for r in range(args.rounds):
                m = await run_once(offsets, bootstrap, broker_pid, logdir, topic, args.records, kind, args)
                log(f"{kind} round {r + 1}: {m.per_s:.0f}/s, worker cpu {m.cpu_ms_per_item:.3f} ms/item")
                runs.append(m)
            bound = 8 * args.partitions / mean_latency_s(kind, args.median_ms, args.p99_ms)
            rate, rate_range = med([m.per_s for m in runs], 0)
            result[f"{kind}_per_s"], result[f"{kind}_per_s_range"] = rate, rate_range
            result[f"bound_{kind}_per_s"] = round(bound, 0)
            result[f"ratio_to_bound_{kind}"] = round(rate / bound, 3)
            result[f"worker_cpu_ms_per_item_{kind}"] = med([m.cpu_ms_per_item for m in runs], 3)[0]
    result["load_avg"] = [started, load_avg()]
    return result


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--broker-pid", type=int, default=None, help="the broker's pid (default: found by port)")
    ap.add_argument("--records", type=int, default=30_000, help="input records per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3000, help="records of each warm-up run")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--median-ms", type=float, default=20.0)
    ap.add_argument("--p99-ms", type=float, default=200.0)
    ap.add_argument("--quick", action="store_true", help="a smoke run (4,000 records, 1 round): not a figure")
    args = ap.parse_args()
    if args.quick:
        args.records, args.rounds, args.warmup = 4000, 1, 1000
    print(json.dumps(run_on_broker(main, args, prefix="streamsched-io-bound-")))


if __name__ == "__main__":
    cli()
