"""Partitions per worker: one ``streamsched run`` process owning every partition of a topic.

For each size N of ``--partitions`` (8,64,256,1024 by default): a fresh transition topic of N
partitions holding ``--per-partition`` (40) due events on every partition (distinct identities,
produced before anything reads them), and a fresh scheduler over it whose external command
returns at once (the ``external`` shape of bench/turns_app.py, claims on disk as ``streamsched
run`` keeps them by default). Its internal topics (state, dead-letter, delay, audit; N partitions
each) are created first and timed on their own (``p<N>_topics_create_s``, until the broker
answers ListOffsets for every one of their partitions), so the start-up figure is the
worker's, not the broker's topic creation.

Then one worker process (real ``streamsched run``, so RSS, sockets and threads are its own) is
started, and the harness polls the group's committed offsets (one OffsetFetch every
``POLL_S``) and the process's ``/proc`` entries until every record is committed or
``--timeout-s`` (180) passed:

* ``p<N>_all_progress_s``: from the process start until the committed offset of every
  partition is past 0 (``p<N>_first_progress_s``: the first one);
* ``p<N>_all_committed_s`` and ``p<N>_rate_per_s``: until every record is committed, and the
  records per second over that whole span (start-up included);
* ``p<N>_rss_mb``: the process's peak RSS (``VmHWM``, read before it is stopped);
* ``p<N>_sockets_per_broker``: the most TCP connections to one broker seen at any poll
  (``/proc/<pid>/fd`` sockets matched with ``/proc/net/tcp*`` against the brokers' addresses),
  ``p<N>_sockets``: all its sockets (event-loop pipes included), ``p<N>_fds``: all its open
  files, ``p<N>_threads``: its most threads (``/proc/<pid>/status``), each the peak over polls;
* a size that does not finish in time records what it reached: ``p<N>_timeout`` true,
  ``p<N>_progressed_fraction``, ``p<N>_committed_fraction`` (the rate is then over the timeout).

Baseline, the same run and topic: a plain aiokafka group member (``clients.consumer``:
read_committed, its own group) that reads until it has seen every partition's records,
``baseline_p<N>_all_seen_s`` from its construction (no transactions, no state, no commits).

A worker keeps a RocksDB store per owned partition (and, with ``STREAMSCHED_TRANSACTIONS=partition``,
a transactional producer per partition), so many partitions need many file descriptors: the
soft ``RLIMIT_NOFILE`` is raised to the hard limit before the broker and the worker start (both
inherit it), and reported (``nofile``). A warm-up size of 8 runs
first. ``target_*`` are the figures set for a future design (1,024 partitions all progressing
within 30 s, RSS <= 250 MB, <= 4 sockets per broker), judged on the largest size run
(``target_judged_on``), each with ``*_met``.

Usage: ``python bench/partition_scale.py [--partitions 8,64,256,1024] [--timeout-s 180]
[--bootstrap HOST:PORT]``. The last line printed is one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turns import load_avg, log, run_on_broker, tag  # noqa: E402
from bench.turns_app import scheduler as bench_scheduler  # noqa: E402
from streamsched.kafka import clients  # noqa: E402
from streamsched.kafka.admin import TopicSpec, apply  # noqa: E402
from streamsched.kafka.producer import Producer  # noqa: E402
from streamsched.kafka.writer import partition_for_key  # noqa: E402
from streamsched.model.event import TransitionEvent  # noqa: E402
from streamsched.model.identity import route_key  # noqa: E402
from streamsched.testing import WorkerProcess, make_event  # noqa: E402

POLL_S = 0.25
TARGETS = {"all_progress_s": 30.0, "rss_mb": 250.0, "sockets_per_broker": 4}
"""For 1,024 partitions on one worker (the design after one producer per partition)."""
WORKERS: list[WorkerProcess] = []
"""Every worker started, so the outermost ``finally`` can make sure none outlives the bench."""


def raise_nofile() -> dict[str, int]:
    """Raise this process's soft open-file limit to the hard one (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return {"soft_before": soft, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard": hard}


# --- the worker's process, from /proc ---------------------------------------------------------------


def proc_status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _kb_to_mb(value: str | None) -> float:
    return round(int(value.split()[0]) / 1024, 1) if value else 0.0


def _address(hexaddr: str) -> tuple[str, int]:
    """``/proc/net/tcp`` ``0100007F:2382`` -> ('127.0.0.1', 9090); IPv6 likewise (v4-mapped as v4)."""
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    text = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)
    return text.removeprefix("::ffff:"), int(port, 16)


def tcp_peers(pid: int) -> dict[str, tuple[str, int]]:
    """Socket inode -> remote address, for every TCP socket of ``pid``'s network namespace."""
    peers: dict[str, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                peers[f[9]] = _address(f[2])
    return peers


@dataclass
class Peaks:
    """The most of each resource seen at any poll of one process."""

    brokers: set[tuple[str, int]]
    fds: int = 0
    sockets: int = 0
    per_broker: int = 0
    threads: int = 0
    by_broker: dict[str, int] = field(default_factory=dict)

    def sample(self, pid: int) -> None:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            return  # gone (or a descriptor closed while listed): the next poll counts
        inodes = [link[8:-1] for link in links if link.startswith("socket:[")]
        peers = tcp_peers(pid)
        counts: dict[str, int] = {}
        for inode in inodes:
            peer = peers.get(inode)
            if peer in self.brokers:
                key = f"{peer[0]}:{peer[1]}"
                counts[key] = counts.get(key, 0) + 1
        self.fds, self.sockets = max(self.fds, len(links)), max(self.sockets, len(inodes))
        if counts and max(counts.values()) > self.per_broker:
            self.per_broker, self.by_broker = max(counts.values()), counts
        self.threads = max(self.threads, int(proc_status(pid).get("Threads", "0")))


async def broker_addresses(bootstrap: str) -> set[tuple[str, int]]:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        brokers = (await admin.describe_cluster())["brokers"]
    finally:
        await admin.close()
    return {(socket.gethostbyname(b["host"]), int(b["port"])) for b in brokers}


# --- input ----------------------------------------------------------------------------------------


def spread(partitions: int, per_partition: int, label: str) -> list[TransitionEvent]:
    """Due events, exactly ``per_partition`` distinct identities on each partition's home."""
    counts = [0] * partitions
    events: list[TransitionEvent] = []
    i = 0
    while len(events) < partitions * per_partition:
        target = [f"{label}-{i}"]
        p = partition_for_key(route_key("t", target), partitions)
        if counts[p] < per_partition:
            counts[p] += 1
            events.append(make_event("due", "t", target, due_ns=i))
        i += 1
    return events


@dataclass
class Size:
    n: int
    topic: str
    name: str
    total: int
    topics_create_s: float
    internal: list[TopicSpec]

    @property
    def group(self) -> str:
        return f"streamsched.{self.name}"


async def prepare(bootstrap: str, n: int, per_partition: int) -> Size:
    """A fresh transition topic with its records, and the fresh scheduler's internal topics."""
    t = tag()
    topic, name = f"pscale-{n}p-{t}", f"pscale{n}x{t}"
    await apply(bootstrap, [TopicSpec(topic, n)], visible_timeout_s=180)
    events = spread(n, per_partition, t)
    async with Producer(bootstrap, linger_ms=5) as producer:
        for start in range(0, len(events), 5000):
            await producer.send_many(topic, events[start:start + 5000])
    started = time.monotonic()
    internal = bench_scheduler("external", topic, name, "unused").internal_topics(n, None)
    await apply(bootstrap, internal, visible_timeout_s=180)
    await serving(bootstrap, internal, deadline_s=180)
    return Size(n, topic, name, len(events), round(time.monotonic() - started, 2), internal)


async def serving(bootstrap: str, specs: list[TopicSpec], *, deadline_s: float) -> None:
    """Until the broker leads every partition of ``specs`` (ListOffsets answered for all).

    Why: a topic is visible in the metadata before its broker has taken the leadership of each
    partition; with 4,096 new partitions on one broker that took about 15 s, during which every
    produce to them failed with NotLeaderForPartition. A worker started then measured the
    broker's topic creation (its first transaction ran past its deadline and every owner
    restarted), not its own start-up."""
    from aiokafka import TopicPartition
    from aiokafka.errors import KafkaError

    tps = [TopicPartition(s.name, p) for s in specs for p in range(s.partitions)]
    consumer = clients.consumer(bootstrap)
    await consumer.start()
    try:
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                await consumer.end_offsets(tps)
                return
            except KafkaError:
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await consumer.stop()


# --- contenders -----------------------------------------------------------------------------------


async def baseline(bootstrap: str, size: Size, per_partition: int, timeout_s: float) -> dict[str, Any]:
    """A plain read_committed group member reading until every partition's records were seen."""
    started = time.monotonic()
    consumer = clients.consumer(bootstrap, size.topic, group_id=f"pscale-base-{tag()}")
    await consumer.start()
    seen: dict[int, int] = {}
    try:
        while sum(1 for c in seen.values() if c >= per_partition) < size.n:
            if time.monotonic() - started > timeout_s:
                full = sum(1 for c in seen.values() if c >= per_partition)
                return {"timeout": True, "seen_fraction": round(full / size.n, 3)}
            batches = await consumer.getmany(timeout_ms=200)
            for tp, records in batches.items():
                seen[tp.partition] = seen.get(tp.partition, 0) + len(records)
        return {"all_seen_s": round(time.monotonic() - started, 2)}
    finally:
        await consumer.stop()


async def committed_by_partition(admin: Any, group: str, topic: str) -> dict[int, int]:
    from aiokafka.errors import KafkaError

    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:
        return {}  # the group's coordinator or offsets are not there yet
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset > 0}


async def run_worker(bootstrap: str, size: Size, brokers: set[tuple[str, int]], logdir: Path,
                     timeout_s: float) -> dict[str, Any]:
    """One worker over ``size``: start-up to progress everywhere, to all committed; its peaks."""
    env = {"BENCH_KIND": "external", "BENCH_TOPIC": size.topic, "BENCH_NAME": size.name,
           "STREAMSCHED_STORE_DIR": os.environ.get("STREAMSCHED_STORE_DIR", str(logdir / "stores"))}
    worker = WorkerProcess("bench.turns_app:app", bootstrap, env=env, cwd=ROOT,
                           log_path=logdir / f"{size.name}.log")
    peaks = Peaks(brokers)
    out: dict[str, Any] = {}
    admin = clients.admin(bootstrap)
    await admin.start()
    started = time.monotonic()
    WORKERS.append(worker.start())
    try:
        first = every = None
        done = progressed = 0
        while True:
            committed = await committed_by_partition(admin, size.group, size.topic)
            peaks.sample(worker.pid)
            at = time.monotonic() - started
            progressed, done = len(committed), sum(committed.values())
            if progressed and first is None:
                first = at
            if progressed == size.n and every is None:
                every = at
                log(f"p{size.n}: every partition progressed at {at:.1f}s")
            if done >= size.total:
                out["all_committed_s"] = round(at, 2)
                break
            if not worker.alive():
                raise RuntimeError(f"worker exited with {worker.wait(1)} at {done}/{size.total}:\n"
                                   f"{worker.log_tail(30)}")
            if at > timeout_s:
                out["timeout"] = True
                log(f"p{size.n}: timed out, {progressed}/{size.n} partitions progressed, "
                    f"{done}/{size.total} records committed; worker log tail:\n{worker.log_tail(15)}")
                break
            await asyncio.sleep(POLL_S)
        status, span = proc_status(worker.pid), out.get("all_committed_s") or time.monotonic() - started
        out.update(first_progress_s=None if first is None else round(first, 2),
                   all_progress_s=None if every is None else round(every, 2),
                   rate_per_s=round(done / max(span, 1e-9), 1),
                   rss_mb=_kb_to_mb(status.get("VmHWM")), rss_end_mb=_kb_to_mb(status.get("VmRSS")),
                   sockets_per_broker=peaks.per_broker, sockets=peaks.sockets, fds=peaks.fds,
                   threads=peaks.threads, sockets_by_broker=peaks.by_broker,
                   progressed_fraction=round(progressed / size.n, 3),
                   committed_fraction=round(done / size.total, 3),
                   nofile_worker=_nofile_of(worker.pid))
    finally:
        stopping = time.monotonic()
        code = await asyncio.to_thread(worker.terminate, 90.0)
        out.update(exit_code=code, exit_s=round(time.monotonic() - stopping, 2))
        await admin.close()
    return out


def _nofile_of(pid: int) -> int | None:
    """The soft open-file limit the worker actually runs with (``/proc/<pid>/limits``)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return None


# --- the run --------------------------------------------------------------------------------------


async def one_size(bootstrap: str, n: int, brokers: set[tuple[str, int]], logdir: Path,
                   args: argparse.Namespace) -> dict[str, Any]:
    log(f"p{n}: preparing {n} partitions x {args.per_partition} events (load {load_avg()})")
    size = await prepare(bootstrap, n, args.per_partition)
    result: dict[str, Any] = {"topics_create_s": size.topics_create_s, "events": size.total}
    base = await baseline(bootstrap, size, args.per_partition, args.timeout_s)
    log(f"p{n}: baseline {base}")
    worker = await run_worker(bootstrap, size, brokers, logdir, args.timeout_s)
    log(f"p{n}: worker {worker}")
    result.update(worker)
    admin = clients.admin(bootstrap)  # later sizes meet a broker without this one's 5 x N partitions
    await admin.start()
    try:
        await admin.delete_topics([size.topic, *(t.name for t in size.internal)])
    finally:
        await admin.close()
    result.update({f"baseline_{k}": v for k, v in base.items()})
    return result


def judge(result: dict[str, Any], sizes: list[int]) -> None:
    """The future design's targets, on the largest size run (1,024 by default)."""
    n = max(sizes)
    result["target_judged_on"] = n
    for key, bound in TARGETS.items():
        result[f"target_{key}"] = bound
        value = result.get(f"p{n}_{key}")
        result[f"target_{key}_met"] = (value is not None and not result.get(f"p{n}_timeout", False)
                                       and value <= bound)


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    started = load_avg()
    result: dict[str, Any] = {"partitions": args.partitions, "per_partition": args.per_partition,
                              "timeout_s": args.timeout_s, "nofile": args.nofile}
    brokers = await broker_addresses(bootstrap)
    result["brokers"] = len(brokers)
    try:
        log("warm-up: 8 partitions")
        warm = await one_size(bootstrap, 8, brokers, logdir, args)
        result["warmup_p8_all_progress_s"] = warm.get("all_progress_s")
        for n in args.partitions:
            for key, value in (await one_size(bootstrap, n, brokers, logdir, args)).items():
                base = key.startswith("baseline_")
                result[f"baseline_p{n}_{key[9:]}" if base else f"p{n}_{key}"] = value
    finally:
        for w in WORKERS:
            if w.alive():
                w.kill()
    judge(result, args.partitions)
    result["load_avg"] = [started, load_avg()]
    return result


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--broker-pid", type=int, default=None, help="unused here (run_on_broker's option)")
    ap.add_argument("--partitions", default="8,64,256,1024", help="comma-separated sizes")
    ap.add_argument("--per-partition", type=int, default=40, help="events per partition")
    ap.add_argument("--timeout-s", type=float, default=180.0, help="per size, worker and baseline each")
    args = ap.parse_args()
    try:
        args.partitions = sorted({int(p) for p in args.partitions.split(",") if p})
    except ValueError:
        ap.error("--partitions takes comma-separated integers")
    if not args.partitions or min(args.partitions) < 1:
        ap.error("--partitions takes positive sizes")
    # aiokafka's producer warns for each retry while a new topic's leaders are elected: noise here.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    args.nofile = raise_nofile()  # before the broker and the workers start: they inherit it
    log(f"open files: {args.nofile}")
    try:
        result = run_on_broker(main, args, prefix="streamsched-partition-scale-")
    finally:
        for w in WORKERS:  # Ctrl-C outside main's own finally, too
            if w.alive():
                w.kill()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cli()
