"""Cross-cluster failover benchmark: RPO and RTO of a failover to a cluster mirrored by MirrorMaker 2.

Each round (:func:`consumers.dr_drill.run_drill`, fresh clusters per round): two single-node Kafka
clusters A and B, the reference workflow ``due_runs`` (its command records every call in a SQLite
ledger, one per cluster), MirrorMaker 2 mirroring A's topics and the group to B with fetches that
wait ``--mirror-wait-ms`` (a cross-region mirror's lag), a steady load of ``--rate`` new identities
per second on A for ``--load-s`` seconds, then every broker of A and its worker SIGKILLed. Failover
with the documented commands (``dr failover`` on B, ``streamsched run`` against B), the producers
re-send what never reached B and go on producing there for ``--after-s`` seconds; B drains.

Keys of the JSON on the last line (medians over ``--rounds``; each key's rounds as ``<key>_rounds``):

* ``lost``: identities whose event is on B that were never executed there (target 0);
* ``dup_outside_unmirrored``: identities executed twice whose outcome had reached B at the kill
  (target 0);
* ``dup_unmirrored``: identities executed on both clusters whose outcome had not (bounded by
  ``unmirrored_outcomes_at_kill``);
* ``unmirrored_outcomes_at_kill``: identities executed on A whose outcome was not on B (RPO);
* ``unmirrored_events_at_kill``: acknowledged events that never reached B (the mirror's loss,
  re-sent by the producing services);
* ``mirror_lag_s``: age at the kill of the oldest acknowledged event that had not reached B (RPO);
* ``rto_s``: from the kill to B's first call (target <= 60 s on this machine);
* ``status_behind_s``: what ``dr status`` said of the lag under load; ``warmup``: the first
  round's figures (JVMs and caches warm; not in the medians).

Usage: ``python bench/failover_dr.py [--rounds 3] [--rate 20] [--load-s 15] [--mirror-wait-ms 1500]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from consumers.dr_drill import DrillReport, run_drill  # noqa: E402

KEYS = ("lost", "dup_outside_unmirrored", "dup_unmirrored", "unmirrored_outcomes_at_kill",
        "unmirrored_events_at_kill", "mirror_lag_s", "rto_s", "status_behind_s")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def one(args: argparse.Namespace, label: str) -> DrillReport:
    with tempfile.TemporaryDirectory(prefix="failover-dr-") as tmp:
        report = await run_drill(Path(tmp), rate=args.rate, load_s=args.load_s, after_s=args.after_s,
                                 mirror_wait_ms=args.mirror_wait_ms, log=lambda m: log(f"[{label}] {m}"))
    log(f"[{label}] {json.dumps(report.to_dict())}")
    return report


async def main(args: argparse.Namespace) -> dict[str, Any]:
    warm = await one(args, "warm-up")
    rounds = [await one(args, f"round {i + 1}") for i in range(args.rounds)]
    out: dict[str, Any] = {}
    for key in KEYS:
        values = [getattr(r, key) for r in rounds]
        known = [v for v in values if v is not None]
        out[key] = statistics.median(known) if known else None
        out[f"{key}_rounds"] = values
    out["targets_met"] = all(r.lost == 0 and r.dup_outside_unmirrored == 0 and r.rto_s <= 60
                             and r.dup_unmirrored <= r.unmirrored_outcomes_at_kill for r in rounds)
    out["warmup"] = {k: getattr(warm, k) for k in KEYS}
    out["settings"] = {"rate": args.rate, "load_s": args.load_s, "after_s": args.after_s,
                       "mirror_wait_ms": args.mirror_wait_ms, "rounds": args.rounds}
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=20.0, help="new identities per second")
    p.add_argument("--load-s", type=float, default=15.0, help="seconds of load on A before the kill")
    p.add_argument("--after-s", type=float, default=10.0, help="seconds of load on B after the failover")
    p.add_argument("--mirror-wait-ms", type=int, default=1500, help="how long the mirror's fetches wait")
    print(json.dumps(asyncio.run(main(p.parse_args()))))
