"""A claim store whose filesystem refuses writes (disk full, read-only): a typed error that stops
the partition, a gauge, a checkpoint that never claims what was not written, and a close that
releases the store anyway. The same on a real full tmpfs, with a worker:
tests/faults/test_fault_full_disk.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamsched.errors import StoreUnwritable
from streamsched.kafka.changelog import Bounds, TopicIdentity
from streamsched.kafka.progress import Progress
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import encode_claim
from streamsched.worker.claimstore import ClaimStore
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.storefaults import unwritable

NOW = 1_800_000_000 * 10**9
IDENT = TopicIdentity("cluster-a", "11111111-2222-3333-4444-555555555555", 86_400_000)
ENOSPC = "IO error: No space left on device: While appending to file: /s/000004.log: No space left on device"


class Rec:
    def __init__(self, state: ClaimState) -> None:
        self.key, self.value = state.identity.encode(), encode_claim(state)


class Reader:
    def __init__(self, records: list[Rec]) -> None:
        self.records = records

    async def pages(self, start: int, end: int) -> Any:
        yield self.records[start:end], end


class FailingDb:
    """RocksDB after its first background error: every write raises, as rocksdict does (a bare
    Exception with the engine's message); reads still work."""

    def __init__(self, db: Any, message: str = ENOSPC) -> None:
        self.db, self.message = db, message

    def write(self, _wb: Any) -> None:
        raise Exception(self.message)

    def flush(self) -> None:
        raise Exception(self.message)

    def close(self) -> None:
        self.db.close()
        raise Exception("IO error: Writer has previous error.")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[StoreEnv]:
    e = StoreEnv(tmp_path / "stores")
    yield e
    e.close()


async def store_of(env: StoreEnv, metrics: Metrics, n: int = 3) -> ClaimStore:
    store = ClaimStore(env, "state.t", 0, metrics=metrics)
    await store.in_thread(store.wipe, IDENT)
    records = [Rec(ClaimState(f"sched_{i}", fence=1)) for i in range(n)]
    await store.catch_up(Reader(records), 0, n, Progress(None, "state.t", 0, 0, n, "cold"))  # type: ignore[arg-type]
    return store


def test_only_the_filesystem_refusing_writes_counts_as_unwritable() -> None:
    assert unwritable(Exception(ENOSPC)) == ENOSPC
    assert unwritable(Exception("IO error: While open a file for appending: Read-only file system"))
    assert unwritable(OSError(28, "No space left on device", "/s/x")) == "No space left on device: /s/x"
    assert unwritable(OSError("Read-only file system (os error 30)")) == "Read-only file system (os error 30)"
    assert unwritable(StoreUnwritable("t", 0, "full")) == "full"
    # A bug or a broker problem is never masked as a storage fault.
    for exc in (Exception("Invalid argument: bad key"), ValueError("io error"), KeyError("x"),
                ConnectionResetError(104, "reset"), TimeoutError()):
        assert unwritable(exc) is None, exc


async def test_a_refused_write_breaks_the_store_which_answers_from_memory_and_keeps_its_checkpoint(
        env: StoreEnv) -> None:
    metrics = Metrics("s")
    store = await store_of(env, metrics)
    assert store.offset == 3 and store.broken is None
    store._db = FailingDb(store._db)
    claim = store.get("sched_new").acquire(owner="w", now_ns=NOW, duration_ns=10, expected_revision=0)
    store.stage()
    store.put(claim)
    # The Kafka transaction committed; the store could not follow. Never raised into the turn
    # (its executions must still be resolved): the store is broken, and says why.
    store.commit_staged()
    assert isinstance(store.broken, StoreUnwritable)
    assert store.broken.kind == "store_unwritable" and "No space left" in str(store.broken)
    assert metrics.gauges["store_unwritable{partition=0}"] == 1
    assert ("state.t", 0) in env.unwritable
    # It answers from memory until the partition stops (what it holds is what Kafka committed).
    store._cache.clear()
    assert store.get("sched_new") == claim
    released = claim.release(fence=claim.fence, expected_revision=claim.revision)
    store.stage()
    store.put(released)
    store.commit_staged()
    assert store.get("sched_new") == released
    store.close()  # never raises for the refused flush, and releases the files and the lock

    again = ClaimStore(env, "state.t", 0)
    assert await again.in_thread(again.open_existing)  # the lock was released
    # The checkpoint never claims the transactions it missed: the changelog's tail is replayed.
    assert again.read_checkpoint() is not None and again.read_checkpoint()[0] == 3  # type: ignore[index]
    assert again.get("sched_new").fence == 0
    assert again.distrust(IDENT, Bounds(0, 7), int(time.time() * 1000)) is None
    again.close()


async def test_any_other_write_error_is_raised_as_it_is(env: StoreEnv) -> None:
    metrics = Metrics("s")
    store = await store_of(env, metrics)
    real = store._db
    store._db = FailingDb(real, "Invalid argument: a bug")
    store.stage()
    store.put(ClaimState("sched_x", fence=2))
    with pytest.raises(Exception, match="Invalid argument") as raised:
        store.commit_staged()
    assert not isinstance(raised.value, StoreUnwritable)
    assert "store_unwritable{partition=0}" not in metrics.gauges
    store._db = real
    store.close()
