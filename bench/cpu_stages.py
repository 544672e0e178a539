"""Where a Kafka-native worker's CPU goes, from a py-spy profile: one row per stage of the turn.

Usage::

    py-spy record -p <worker pid> --format raw -r 200 -o prof.txt   # while bench/turns.py runs
    python bench/cpu_stages.py <worker ms of CPU per item> prof.txt [more.txt ...]

Each sample goes to the first stage (in the order of :data:`STAGES`) with a marker frame in its
stack; the selection stages only count stacks under the selector (py-spy rebuilds async stacks
from frames, and a coroutine's caller is sometimes attributed loosely). Samples of start-up
(imports, restore, group join: no stage's frame) are left out, and the shares of the rest are
scaled by the measured CPU per item. Sampling at 200 Hz, a stage below about 1 % is noise.
"""

from __future__ import annotations

import sys
from collections import Counter

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("select: decode + validate (Avro, JSON bounds)", ("decode_transition",)),
    ("select: identity + route key (sha256)", ("IdentityResolver.", "route_key (", "with_route_key")),
    ("select: routing check (murmur2)", ("_home_partition", "partition_for_key")),
    ("select: claim state lookups (store)", ("StateBase.get", "ClaimStore.get")),
    ("select: other (items, leaders, metrics)", ("TurnRunner.prepare", "Selector.select",
                                                 "TurnRunner._selected")),
    ("claim in memory (state machine)", ("PartitionSteps.acquire",)),
    ("execute: handler + command (user code, JSON emit)", ("handle_native", "Bounded.run")),
    ("execute: context, outcome, digest", ("PartitionSteps.execute_all",)),
    ("resolve: outcome + release, encode snapshot", ("PartitionSteps.write_resolution",
                                                     "PartitionSteps.write_others")),
    ("commit: partition emits (murmur2) + build batches", ("GroupedWriter.flush",)),
    ("commit: store write batch (RocksDB)", ("ClaimStore.put", "StateBase.put", "commit_staged",
                                             "ClaimStore._flush")),
    ("commit: transaction requests (aiokafka)", ("transaction (", "Checkpoint.commit")),
    ("turn: other (gathering, accounting, metrics)", ("KafkaNative.", "TurnRunner.step")),
    ("fetch: aiokafka fetch + record parsing", ("AIOKafkaConsumer.", "Fetcher.", "FetchGuard",
                                                "Worker._intake")),
    ("network I/O + event loop (connections, selector)", ("BaseEventLoop.run_forever",)),
)
_SELECTOR = ("Selector.", "TurnRunner.prepare")


def stage_of(frames: list[str]) -> str | None:
    under_selector = any(any(m in f for m in _SELECTOR) for f in frames)
    for name, marks in STAGES:
        if name.startswith("select:") and not under_selector:
            continue
        if any(any(m in f for m in marks) for f in frames):
            return name
    return None


def main(argv: list[str]) -> None:
    ms_per_item = float(argv[0])
    counts: Counter[str | None] = Counter()
    for path in argv[1:]:
        with open(path) as f:
            for line in f:
                stack, _, n = line.rstrip().rpartition(" ")
                if stack:
                    counts[stage_of(stack.split(";"))] += int(n)
    steady = sum(n for stage, n in counts.items() if stage is not None)
    print(f"samples: {sum(counts.values())}, in the turn's stages: {steady}")
    print("| stage | ms/item | share |\n|---|---|---|")
    for name, _ in STAGES:
        share = counts[name] / max(1, steady)
        print(f"| {name} | {ms_per_item * share:.4f} | {100 * share:.1f} % |")


if __name__ == "__main__":
    main(sys.argv[1:])
