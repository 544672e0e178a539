"""What the clock-skew, full-disk and compaction fault scenarios share (test_fault_clock_skew.py,
test_fault_full_disk.py, test_fault_compaction.py): skewed clocks with libfaketime, a small tmpfs
that can be filled or made read-only, a worker's status endpoints, and the clock-free audit of
executions against the outcomes the state topic stored.

Skipped locally, failed under ``CI=true``, where a tool cannot be had (``tests/components.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumers.harness import Workflow, claim_history, judge_calls, ledger_calls
from consumers.ledger import Ledger
from streamsched.kafka import clients
from tests.components import require

# --- clocks -------------------------------------------------------------------------------------

LIBFAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                     "/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
"""The multi-threaded build first: a worker has threads (the claim store's writer, to_thread)."""


def libfaketime() -> str | None:
    for pattern in LIBFAKETIME_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def skewed_env(offset_s: int) -> dict[str, str]:
    """Environment that runs a child with its wall clock ``offset_s`` seconds off (libfaketime).

    Only the wall clock (``time.time``, ``time.time_ns``, ``CLOCK_REALTIME``) is shifted:
    ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves ``CLOCK_MONOTONIC`` alone, which asyncio's loop,
    aiokafka's timeouts and ``threading`` waits run on, so the worker behaves normally apart from
    the time it reads from the wall clock (claims' leases, checkpoints, due times, schedules).
    :func:`check_skew` proves that in a child before a scenario relies on it."""
    lib = libfaketime()
    if lib is None:
        require("libfaketime", "install the Debian package faketime (make fault-tools)")
    return {"LD_PRELOAD": lib, "FAKETIME": f"{offset_s:+d}", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_NO_CACHE": "1"}


_PROBE = """
import asyncio, json, time
t0, n0, m0 = time.time(), time.time_ns(), time.monotonic()
asyncio.run(asyncio.sleep(0.2))
print(json.dumps({"time": t0, "time_ns": n0, "mono": m0, "slept_mono": time.monotonic() - m0,
                  "slept_wall": time.time() - t0}))
"""


def check_skew(offset_s: int) -> None:
    """A child under :func:`skewed_env` sees ``time.time()`` and ``time.time_ns()`` shifted by
    ``offset_s`` (within 5 s), and a monotonic clock and asyncio timers that still run at the
    real rate; skip (fail under CI) if not."""
    env = {**os.environ, **skewed_env(offset_s)}
    before = time.time()
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    after = time.time()
    if out.returncode != 0:
        require("a working libfaketime", f"a Python child under LD_PRELOAD failed: {out.stderr[-300:]}")
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    for key, scale in (("time", 1.0), ("time_ns", 1e-9)):
        shift = probe[key] * scale - before
        if not (offset_s - 5 <= shift <= offset_s + (after - before) + 5):
            require("a working libfaketime", f"{key} in the child is off by {shift:.1f}s, not {offset_s}s")
    if abs(probe["mono"] - time.monotonic()) > 60 or not 0.15 <= probe["slept_mono"] <= 5:
        require("a working libfaketime", f"the child's monotonic clock was faked too: {probe}")


# --- disks --------------------------------------------------------------------------------------

@dataclass
class Tmpfs:
    """A mounted tmpfs of a few megabytes: filled to the last byte, or remounted read-only."""

    path: Path
    size: str
    filler: Path = field(init=False)

    def __post_init__(self) -> None:
        self.filler = self.path / "filler"

    def fill(self) -> int:
        """Write the filler until the filesystem says it is full; returns the bytes added."""
        added = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            chunk = b"\0" * 65536
            while True:
                try:
                    added += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return added
                    chunk = chunk[: len(chunk) // 2]
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def available(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def remount(self, *, read_only: bool) -> None:
        mode = "ro" if read_only else "rw"
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True,
                       capture_output=True, timeout=30)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Tmpfs]:
    """``path`` mounted as a tmpfs of ``size`` (e.g. ``16m``) for the block; always unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        require("mount", "the scenario mounts a small tmpfs (needs mount(8) and root)")
    if out.returncode != 0:
        require("tmpfs mounting", f"mount -t tmpfs failed (needs root or CAP_SYS_ADMIN): "
                                  f"{out.stderr.strip()[-200:]}")
    fs = Tmpfs(path, size)
    try:
        yield fs
    finally:
        with contextlib.suppress(Exception):
            fs.remount(read_only=False)
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.2)  # a worker still closing its files
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


# --- a worker's status endpoints ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_env(port: int) -> dict[str, str]:
    return {"STREAMSCHED_STATUS_PORT": str(port), "STREAMSCHED_STATUS_HOST": "127.0.0.1"}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


async def get(port: int, path: str) -> tuple[int, str]:
    """``GET http://127.0.0.1:<port><path>``: (status, body); (0, reason) if nothing answers."""
    try:
        return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{path}")
    except OSError as exc:
        return 0, str(exc)


async def status(port: int) -> dict[str, Any]:
    """The worker's one scheduler as ``/status`` shows it (``{}`` if it does not answer)."""
    code, body = await get(port, "/status")
    if code != 200:
        return {}
    doc = json.loads(body)
    return {**doc["schedulers"][0], "ready": doc["ready"]}


def metric_lines(body: str, name: str) -> list[str]:
    """The sample lines of ``streamsched_<name>`` in a ``/metrics`` body."""
    prefix = f"streamsched_{name}"
    return [line for line in body.splitlines()
            if line.startswith(prefix) and line[len(prefix)] in "{ "]


async def group_members(bootstrap: str, group: str) -> list[str]:
    """The client ids of consumer group ``group``'s members right now (a worker's is its owner
    id, ``<host>-<pid>-<hex>``); empty: none, or no such group."""
    from aiokafka.errors import KafkaError

    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
    except KafkaError:
        return []  # no coordinator for it yet: nobody joined
    finally:
        await admin.close()
    # describe_groups v0..: (error, group, state, protocol type, protocol, members); a member is
    # (member id, client id, client host, metadata, assignment).
    return [str(m[1]) for resp in described for g in getattr(resp, "groups", [])[:1] for m in g[5]]


async def members_are(bootstrap: str, group: str, *workers: Any) -> bool:
    """Exactly ``workers`` (WorkerProcess) are the group's members (dead ones have left)."""
    ids = await group_members(bootstrap, group)
    return len(ids) == len(workers) and all(any(f"-{w.pid}-" in i for i in ids) for w in workers)


# --- executions ---------------------------------------------------------------------------------

def accepted_calls(wf: Workflow) -> Counter[str]:
    """Calls the ledger accepted per idempotency key (its ``effects`` table dedupes by key, so it
    cannot show a re-execution; its ``calls`` log can)."""
    if not wf.ledger.exists():
        return Counter()
    return Counter(key for key, _fence, accepted in Ledger(wf.ledger).calls() if accepted)


def refused_calls(wf: Workflow) -> Counter[str]:
    """Calls the ledger refused for a stale fence (a newer claim's call came first)."""
    if not wf.ledger.exists():
        return Counter()
    return Counter(key for key, _fence, accepted in Ledger(wf.ledger).calls() if not accepted)


async def reexecuted(bootstrap: str, wf: Workflow) -> dict[str, list[int]]:
    """Per identity, the fences of accepted calls made under a claim taken after its outcome was
    stored (:func:`consumers.harness.judge_calls` by fence only). Clock-free: no timestamp is
    compared, so it holds whatever the workers' clocks say (the ledger's call times and the
    state records' timestamps come from the workers' own, possibly skewed, clocks)."""
    return judge_calls(ledger_calls(wf.ledger), await claim_history(bootstrap, wf)).after_outcome


# --- logs ---------------------------------------------------------------------------------------

def logs_of(tmp: Path, *names: str) -> dict[str, str]:
    """The logs (``<tmp>/<name>.log``) of the named workers that ran, for
    :func:`tests.faults.fault_logs.judge_logs`."""
    return {n: p.read_text(errors="replace") for n in names if (p := tmp / f"{n}.log").exists()}
