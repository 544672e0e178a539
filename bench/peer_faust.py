"""Peer benchmark: the claim -> no-op -> outcome workload as a Faust agent, beside streamsched.

Contenders, each a separate process reading the same pre-produced 8-partition transition topic
(fresh consumer group per run), measured from outside as bench/turns.py measures (the group's
committed offsets polled every 25 ms, rate over the 10 %-90 % window, process and broker CPU from
/proc), except that progress is interpolated between commits, not polls (see :func:`measure`;
``<contender>_window_commits`` says how many commits each window spans):

streamsched   the ``external`` workload of bench/turns.py (consumers/due_runs.py's shape): claim
              the identity, run a no-op external command, store the outcome and release, with
              the offsets committed in the outcome's transaction.
faust_eos     a Faust agent doing the same against a changelog-backed Table (in-memory store,
              every write also a changelog record): ``table[identity] = "claimed"``, no-op,
              ``table[identity] = "done"`` (an identity already ``"done"`` is skipped), with
              ``processing_guarantee="exactly_once"`` (transactional producers, offsets sent in
              the transaction).
faust_alo     the same agent with ``processing_guarantee="at_least_once"``. It flushes its
              producer inside each commit and so commits the whole input in one or two steps: no
              rate between commits. Its rate is then taken from its table's changelog, which grows
              as it processes (``faust_alo_measured_by``: ``changelog writes``); every Faust
              contender also reports ``<kind>_changelog_per_s``.

Faust decodes the records with streamsched's Faust codec (``value_serializer="streamsched"``)
and computes the same business identity (sha256) as the scheduler, so both pay for decoding and
identities. Both commit every 0.1 s (``--commit-interval`` for streamsched, as bench/turns.py;
``--faust-commit-interval`` for Faust, whose own default is 2.8 s): the same commit cadence, and
the 10 %-90 % window needs several commits to resolve a rate.

A warm-up pass of every contender runs first; then ``--rounds`` rounds (3) of each; every rate
is the median with its range (``<key>_range``).

``--kill-test`` adds the crash check behind the documented claim: each contender processes a fresh
copy of the input and is SIGKILLed at the first commit observed after ``--kill-after`` of the
records were committed (the group's offsets polled every 25 ms, so the kill lands within ~25 ms
of a commit). Then, from Kafka alone (read_committed): every record below the group's committed
offsets has been marked consumed; the contender's durable state for its identity is the last
changelog value (Faust) or the last claim snapshot on the state topic (streamsched). An identity
whose record was consumed but whose state is not ``done``/RELEASED is *lost*: after a restart
nothing re-reads its record. Reported per contender as ``kill_lost`` (one count per kill round).

Usage: ``python bench/peer_faust.py [--bootstrap HOST:PORT] [--records N] [--rounds R]
[--kill-test] [--quick]``; without ``--bootstrap`` a fresh local broker is started. Needs
faust-streaming (``pip install -e '.[faust]'``). Last line: one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turns import (  # noqa: E402
    PARTITIONS,
    POLL_S,
    WINDOW,
    Context,
    Measured,
    Offsets,
    Proc,
    crossing,
    input_topic,
    load_avg,
    log,
    measure,
    med,
    run_on_broker,
    start_worker,
    tag,
)
from bench.turns_app import scheduler as bench_scheduler  # noqa: E402
from streamsched.kafka import clients  # noqa: E402
from streamsched.kafka.reads import read_topic  # noqa: E402
from streamsched.model.claims import ClaimStatus  # noqa: E402
from streamsched.model.names import internal_topic  # noqa: E402
from streamsched.testing import child_pythonpath  # noqa: E402
from streamsched.wire.claim import decode_claim  # noqa: E402
from streamsched.wire.transition import decode_transition  # noqa: E402

TABLE = "claims"
MIN_WINDOW_COMMITS = 3
GUARANTEES = {"faust_eos": "exactly_once", "faust_alo": "at_least_once"}


class FaustProc(Proc):
    """A Faust worker role: it never exits by itself, so finishing it is SIGTERM (then SIGKILL)."""

    def finish(self, timeout: float = 60.0) -> int | None:
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)
        return 0 if code in (0, -signal.SIGTERM) else code


def start_faust(ctx: Context, topic: str, app_id: str, guarantee: str, commit_interval: float) -> FaustProc:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "faust", "--bootstrap", ctx.bootstrap,
           "--topic", topic, "--app-id", app_id, "--guarantee", guarantee,
           "--faust-commit-interval", str(commit_interval), "--datadir", str(ctx.logdir / app_id)]
    env = dict(os.environ, PYTHONPATH=child_pythonpath([ROOT], os.environ.get("PYTHONPATH")))
    out = open(ctx.logdir / f"{app_id}.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return FaustProc(popen=subprocess.Popen(cmd, cwd=str(ctx.logdir), env=env, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    finally:
        out.close()


async def run_faust(ctx: Context, kind: str, topic: str, total: int,
                    commit_interval: float) -> tuple[Measured, float | None]:
    """The contender's committed-offset measurement, and its rate of table writes seen on the
    changelog (see :func:`changelog_rate`)."""
    app_id = f"pf-{kind[6:]}-{tag()}"
    proc = start_faust(ctx, topic, app_id, GUARANTEES[kind], commit_interval)
    done = asyncio.Event()
    watching = asyncio.create_task(changelog_rate(ctx, f"{app_id}-{TABLE}-changelog", total, done))
    try:
        measured = await measure(ctx.offsets, proc, app_id, topic, total, ctx.broker_pid,
                                 timeout_s=total / 50 + 180, changes_only=True)
    except (RuntimeError, TimeoutError) as exc:
        # The log lives in a temporary directory: say what the contender said before it goes.
        tail = (ctx.logdir / f"{app_id}.log").read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"{exc}; the Faust contender's last lines:\n" + "\n".join(tail)) from exc
    finally:
        done.set()
    return measured, await watching


async def changelog_rate(ctx: Context, changelog: str, total: int, done: asyncio.Event) -> float | None:
    """Items per second over the 10-90 % window, counted as the Faust table's changelog grows
    (two writes per item: claimed, done), polled every 25 ms until ``done``.

    Faust at least once commits its input offsets only after flushing its producer, which here
    moved the whole input in one or two commits: no rate between commits. Its processing still
    shows on the changelog as it happens (non-transactional writes), so this is that guarantee's
    throughput; for exactly once the changelog grows only at commits (read_committed end offsets).
    """
    from aiokafka import TopicPartition

    consumer = clients.consumer(ctx.bootstrap)
    await consumer.start()
    tps = [TopicPartition(changelog, p) for p in range(PARTITIONS)]
    samples: list[tuple[float, ...]] = []
    exists = False
    try:
        while not done.is_set():
            # Until Faust created it, asking for its offsets only makes aiokafka log warnings.
            exists = exists or changelog in await consumer.topics()
            if exists:
                ends = await consumer.end_offsets(tps)
                samples.append((time.perf_counter(), sum(ends.values()) / 2))
            await asyncio.sleep(POLL_S if exists else 4 * POLL_S)
    finally:
        await consumer.stop()
    lo, hi = WINDOW[0] * total, WINDOW[1] * total
    if not samples or samples[0][1] >= lo:
        return None  # the window began before the first sample: no rate for it
    at_lo, at_hi = crossing(samples, lo), crossing(samples, hi)
    if at_lo is None or at_hi is None or at_hi[0] <= at_lo[0]:
        return None
    return (hi - lo) / (at_hi[0] - at_lo[0])


async def run_streamsched(ctx: Context, topic: str, total: int) -> Measured:
    name = f"pfs{tag()}"
    proc = start_worker(ctx.bootstrap, ctx.logdir, "external", topic, name, "bench-out",
                        ctx.commit_interval_s)
    return await measure(ctx.offsets, proc, f"streamsched.{name}", topic, total, ctx.broker_pid,
                         timeout_s=total / 100 + 180, changes_only=True)


# --- measuring from outside, between commits ----------------------------------------------------


# --- the crash check ------------------------------------------------------------------------------


async def committed_by_partition(ctx: Context, group: str, topic: str) -> dict[int, int]:
    node = await ctx.offsets.admin.find_coordinator(group)
    offsets = await ctx.offsets.admin.list_consumer_group_offsets(group, group_coordinator_id=node)
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset >= 0}


async def kill_after_commit(ctx: Context, proc: Proc, group: str, topic: str, threshold: int,
                            timeout_s: float) -> int:
    """SIGKILL ``proc`` at the first commit seen once ``threshold`` records were committed."""
    deadline = time.monotonic() + timeout_s
    last = 0
    while True:
        done = await ctx.offsets.committed(group, topic)
        if done > last and done >= threshold:
            os.kill(proc.pid, signal.SIGKILL)
            proc.finish(30)
            return done
        last = done
        if not proc.alive():
            raise RuntimeError(f"contender {proc.pid} exited before the kill (committed {done})")
        if time.monotonic() > deadline:
            proc.finish(30)
            raise TimeoutError(f"no commit past {threshold} within {timeout_s:.0f}s (committed {done})")
        await asyncio.sleep(POLL_S)


async def consumed_identities(ctx: Context, topic: str, committed: dict[int, int]) -> set[str]:
    """Identities of every record below the committed offsets (the bench scheduler's identities:
    Faust's agent computes the same ones)."""
    resolve = bench_scheduler("external", topic, "bench", "bench-out").resolve_identity
    out: set[str] = set()
    for rec in await read_topic(ctx.bootstrap, topic, timeout_s=120, max_records=10_000_000):
        if rec.offset < committed.get(rec.partition, 0):
            ev = decode_transition(rec.value)
            out.add(resolve(ev.due_ns, ev.tenant, ev.target))
    return out


async def kill_faust(ctx: Context, kind: str, topic: str, total: int, commit_interval: float,
                     after: float) -> dict[str, int]:
    app_id = f"pf-kill-{kind[6:]}-{tag()}"
    proc = start_faust(ctx, topic, app_id, GUARANTEES[kind], commit_interval)
    at = await kill_after_commit(ctx, proc, app_id, topic, int(after * total), total / 50 + 180)
    committed = await committed_by_partition(ctx, app_id, topic)
    # Faust's table keys and values are JSON (its default serializer); the last value wins.
    state: dict[str, str] = {}
    for rec in await read_topic(ctx.bootstrap, f"{app_id}-{TABLE}-changelog", timeout_s=120,
                                max_records=10_000_000):
        state[json.loads(rec.key)] = json.loads(rec.value) if rec.value is not None else None
    return _lost(await consumed_identities(ctx, topic, committed), state, "done", at)


async def kill_streamsched(ctx: Context, topic: str, total: int, after: float) -> dict[str, int]:
    name = f"pfk{tag()}"
    proc = start_worker(ctx.bootstrap, ctx.logdir, "external", topic, name, "bench-out",
                        ctx.commit_interval_s)
    group = f"streamsched.{name}"
    at = await kill_after_commit(ctx, proc, group, topic, int(after * total), total / 100 + 180)
    committed = await committed_by_partition(ctx, group, topic)
    state: dict[str, str] = {}
    for rec in await read_topic(ctx.bootstrap, internal_topic("state", name), timeout_s=120,
                                max_records=10_000_000):
        if rec.value is not None:
            snap = decode_claim(rec.value)
            state[snap.identity] = snap.status.value
    # The bench scheduler's identities are bound to its name: resolve them under this one.
    resolve = bench_scheduler("external", topic, name, "bench-out").resolve_identity
    consumed: set[str] = set()
    for rec in await read_topic(ctx.bootstrap, topic, timeout_s=120, max_records=10_000_000):
        if rec.offset < committed.get(rec.partition, 0):
            ev = decode_transition(rec.value)
            consumed.add(resolve(ev.due_ns, ev.tenant, ev.target))
    return _lost(consumed, state, ClaimStatus.RELEASED.value, at)


def _lost(consumed: set[str], state: dict[str, Any], done: str, at: int) -> dict[str, int]:
    lost = [i for i in consumed if state.get(i) != done]
    return {"committed_at_kill": at, "consumed": len(consumed), "lost": len(lost),
            "lost_never_written": sum(1 for i in lost if i not in state)}


# --- the run ----------------------------------------------------------------------------------------


async def main(bootstrap: str, broker_pid: int | None, args: argparse.Namespace,
               logdir: Path) -> dict[str, Any]:
    records, rounds, fci = args.records, args.rounds, args.faust_commit_interval
    started = load_avg()
    log(f"records={records} rounds={rounds} broker_pid={broker_pid} load={started}")
    out: dict[str, Any] = {"records": records, "rounds": rounds, "partitions": PARTITIONS,
                           "commit_interval_s": args.commit_interval, "faust_commit_interval_s": fci}
    async with Offsets(bootstrap) as offsets:
        ctx = Context(bootstrap, broker_pid, offsets, logdir, args.commit_interval)
        log(f"producing warm-up ({args.warmup}) and input ({records}) topics")
        warm = await input_topic(bootstrap, PARTITIONS, args.warmup)
        main_topic = await input_topic(bootstrap, PARTITIONS, records)

        log("warm-up pass")
        await run_streamsched(ctx, warm, args.warmup)
        for kind in GUARANTEES:
            await run_faust(ctx, kind, warm, args.warmup, fci)

        res: dict[str, list[Measured]] = {"streamsched": [], "faust_eos": [], "faust_alo": []}
        by_changelog: dict[str, list[float | None]] = {kind: [] for kind in GUARANTEES}
        for r in range(rounds):
            res["streamsched"].append(await run_streamsched(ctx, main_topic, records))
            for kind in GUARANTEES:
                measured, changelog_per_s = await run_faust(ctx, kind, main_topic, records, fci)
                res[kind].append(measured)
                by_changelog[kind].append(changelog_per_s)
            log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1].per_s:.0f}/s ({v[-1].steps} commits)"
                                              for k, v in res.items())
                + f" load={load_avg()}")

        for k, ms in res.items():
            out[f"{k}_per_s"], out[f"{k}_per_s_range"] = med([m.per_s for m in ms])
            out[f"{k}_window_commits"] = [m.steps for m in ms]
            out[f"{k}_cpu_ms_per_item"], _ = med([m.cpu_ms_per_item for m in ms], 4)
            out[f"{k}_broker_cpu_ms_per_item"], _ = med([m.broker_cpu_ms_per_item for m in ms], 4)
            if k in by_changelog:
                rates = [r for r in by_changelog[k] if r is not None]
                out[f"{k}_changelog_per_s"], out[f"{k}_changelog_per_s_range"] = (
                    med(rates) if len(rates) == len(by_changelog[k]) else (None, None))
            out[f"{k}_measured_by"] = "committed offsets"
            if statistics.median(out[f"{k}_window_commits"]) < MIN_WINDOW_COMMITS:
                # Faust at least once flushes its producer buffer inside each commit: it can commit
                # the whole input in one or two steps, and a rate between them is no throughput.
                # Its table writes reach the changelog as they happen: that rate stands in.
                out[f"{k}_unresolved"] = "fewer than 3 commits inside the 10-90% window"
                out[f"{k}_per_s"] = out.get(f"{k}_changelog_per_s")
                out[f"{k}_per_s_range"] = out.get(f"{k}_changelog_per_s_range")
                out[f"{k}_measured_by"] = "changelog writes" if out[f"{k}_per_s"] is not None else None
                # CPU per item comes from the same committed-offset window, which has no width here.
                out[f"{k}_cpu_ms_per_item"] = out[f"{k}_broker_cpu_ms_per_item"] = None
        for k in GUARANTEES:
            if out[f"{k}_per_s"] is not None:
                out[f"ratio_streamsched_to_{k}"] = round(out["streamsched_per_s"] / out[f"{k}_per_s"], 3)

        if args.kill_test:
            kills: dict[str, list[dict[str, int]]] = {"streamsched": [], "faust_eos": [], "faust_alo": []}
            for r in range(args.kill_rounds):
                kills["streamsched"].append(await kill_streamsched(ctx, main_topic, records, args.kill_after))
                for kind in GUARANTEES:
                    kills[kind].append(await kill_faust(ctx, kind, main_topic, records, fci, args.kill_after))
                log(f"kill round {r + 1}: " + ", ".join(f"{k} {v[-1]}" for k, v in kills.items()))
            out["kill_after"] = args.kill_after
            for k, runs in kills.items():
                out[f"{k}_kill_lost"] = [run["lost"] for run in runs]
                out[f"{k}_kill_runs"] = runs
    out["load_avg"] = {"start": started, "end": load_avg()}
    out["broker_cpu_measured"] = broker_pid is not None
    return out


# --- the Faust role (a child process) ---------------------------------------------------------------


def role_faust(args: argparse.Namespace) -> None:
    import faust

    from streamsched.integrations.faust import CODEC_NAME, register_codec

    register_codec()
    resolve = bench_scheduler("external", args.topic, "bench", "bench-out").resolve_identity
    app = faust.App(
        args.app_id,
        broker=";".join(f"kafka://{hp}" for hp in args.bootstrap.split(",")),
        datadir=args.datadir,
        processing_guarantee=args.guarantee,
        broker_commit_interval=args.faust_commit_interval,
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        web_enabled=False,
    )
    source = app.topic(args.topic, key_serializer="raw", value_serializer=CODEC_NAME)
    claims = app.Table(TABLE, default=None, partitions=PARTITIONS, key_type=str, value_type=str)

    @app.agent(source)
    async def turn(stream: Any) -> None:
        async for event in stream:
            identity = resolve(event.due_ns, event.tenant, event.target)
            if claims.get(identity) == "done":
                continue  # resolved before: no effect
            claims[identity] = "claimed"  # the claim, durable through the changelog
            # the effect: a no-op, as streamsched's external bench command
            claims[identity] = "done"  # the outcome

    # `faust worker` turns the web server on whatever web_enabled says: two contenders (or a
    # test's Faust app) would fight over port 6066.
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "warn"]
    app.main()


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=None, help="use this cluster instead of a fresh local broker")
    ap.add_argument("--broker-pid", type=int, default=None, help="the broker's pid (default: found by port)")
    ap.add_argument("--records", type=int, default=25_000, help="input records per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3000, help="records of the warm-up pass")
    ap.add_argument("--commit-interval", type=float, default=0.1,
                    help="STREAMSCHED_COMMIT_INTERVAL (seconds) of the streamsched worker")
    ap.add_argument("--faust-commit-interval", type=float, default=0.1,
                    help="Faust's broker_commit_interval (its default is 2.8 s; 0.1 s commits as often "
                         "as the streamsched worker, and lets the window resolve Faust's rate)")
    ap.add_argument("--kill-test", action="store_true", help="also run the SIGKILL-after-commit check")
    ap.add_argument("--kill-rounds", type=int, default=3)
    ap.add_argument("--kill-after", type=float, default=0.3,
                    help="kill at the first commit after this fraction of the records")
    ap.add_argument("--quick", action="store_true", help="a smoke run (5,000 records, 1 round): not a figure")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--app-id", help=argparse.SUPPRESS)
    ap.add_argument("--guarantee", help=argparse.SUPPRESS)
    ap.add_argument("--datadir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "faust":
        role_faust(args)
        return
    if args.quick:
        args.records, args.rounds, args.warmup, args.kill_rounds = 5000, 1, 1000, 1
    print(json.dumps(run_on_broker(main, args, prefix="streamsched-peer-faust-")))


if __name__ == "__main__":
    cli()
