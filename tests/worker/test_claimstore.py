"""The disk-backed claim store and the outcome horizon, without a broker (pages are fed directly).

What the Kafka side does (identities, bounds, real pages) is in test_horizon_kafka.py; here the
store's own rules: checkpoint arithmetic, trust decisions, the bounded cache, the horizon scan,
tombstones and the fence floor, for the disk store and the in-memory one alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.errors import ChangelogBehind, ConfigError
from streamsched.kafka.changelog import Bounds, TopicIdentity
from streamsched.kafka.progress import Progress
from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.wire.claim import encode_claim, resolved_at
from streamsched.worker.claimstore import ENTRY_OVERHEAD, ClaimStore
from streamsched.worker.rocksenv import StoreEnv
from streamsched.worker.statebase import FLOOR_IDENTITY, HORIZON_DEFAULT_S, StateBase, check_horizon
from streamsched.worker.store import PartitionState

DAY_NS = 86_400 * 10**9
NOW = 1_800_000_000 * 10**9
IDENT = TopicIdentity("cluster-a", "11111111-2222-3333-4444-555555555555", 86_400_000)


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None


class FakeReader:
    """Pages of records as PartitionReader yields them (the position after each page)."""

    def __init__(self, records: list[Rec], page: int = 3) -> None:
        self.records, self.page = records, page

    async def pages(self, start: int, end: int) -> AsyncIterator[tuple[list[Rec], int]]:
        for i in range(start, min(end, len(self.records)), self.page):
            chunk = self.records[i:min(i + self.page, end)]
            yield chunk, i + len(chunk)


def resolved(identity: str, fence: int, at_ns: int) -> ClaimState:
    return ClaimState(identity, ClaimStatus.RELEASED, "", fence, 0, fence, 3 * fence,
                      Outcome(OutcomeKind.SUCCEEDED, fence, at_ns))


def rec(state: ClaimState) -> Rec:
    return Rec(state.identity.encode(), encode_claim(state))


async def restored(env: StoreEnv, records: list[Rec], *, topic: str = "state.t", partition: int = 0,
                   horizon_s: float = HORIZON_DEFAULT_S) -> ClaimStore:
    store = ClaimStore(env, topic, partition, horizon_s=horizon_s)
    await store.in_thread(store.wipe, IDENT)
    await store.catch_up(FakeReader(records), 0, len(records),  # type: ignore[arg-type]
                         Progress(None, topic, partition, 0, len(records), "cold"))
    return store


@pytest.fixture
def env(tmp_path: Path) -> Iterator[StoreEnv]:
    e = StoreEnv(tmp_path / "stores", cache_bytes=64 * 1024)
    yield e
    e.close()


# --- the wire shortcut the horizon scan uses ---------------------------------------------------

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
states = st.builds(
    ClaimState, identity=st.text(min_size=1, max_size=80), status=st.sampled_from(ClaimStatus),
    owner=st.text(max_size=40), fence=longs, lease_expires_ns=longs, ordinal=longs, revision=longs,
    outcome=st.none() | st.builds(Outcome, kind=st.sampled_from(OutcomeKind), fence=longs, at_ns=longs,
                                  events=st.integers(min_value=0, max_value=2**31 - 1),
                                  digest=st.binary(max_size=40), error_kind=st.none() | st.text(max_size=10)))


@settings(max_examples=300)
@given(states)
def test_resolved_at_reads_the_outcome_time_of_released_snapshots_only(state: ClaimState) -> None:
    want = state.outcome.at_ns if state.status is ClaimStatus.RELEASED and state.outcome else None
    assert resolved_at(encode_claim(state)) == want


def test_resolved_at_ignores_other_records() -> None:
    assert resolved_at(b"\x00garbage") is None
    with pytest.raises(IndexError):
        resolved_at(encode_claim(resolved("sched_x", 1, 5))[:12])  # truncated: the scan skips it


# --- restore, checkpoint, trust ------------------------------------------------------------------

async def test_cold_restore_applies_pages_tombstones_and_skips_corrupt_records(env: StoreEnv) -> None:
    a1, a2, b = resolved("sched_a", 1, NOW), resolved("sched_a", 2, NOW), resolved("sched_b", 1, NOW)
    records = [rec(a1), rec(b), Rec(b"sched_a", b"\x00garbage"), rec(a2), Rec(b"sched_b", None),
               Rec(None, b"x")]
    store = await restored(env, records)
    assert store.get("sched_a") == a2  # the garbage record did not replace a1 either
    assert store.get("sched_b") == ClaimState("sched_b")
    assert store.corrupt == 2 and store.offset == len(records)
    assert store.read_checkpoint() is not None and store.read_checkpoint()[0] == len(records)  # type: ignore[index]
    store.close()


async def test_small_pages_are_gathered_into_writes_each_with_its_checkpoint(
        env: StoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.metrics import Metrics
    from streamsched.worker import claimstore

    monkeypatch.setattr(claimstore, "WRITE_RECORDS", 7)
    written: list[int] = []
    write_behind = ClaimStore._write_behind

    async def spy(self: ClaimStore, wb: object, position: int, at_ms: int) -> None:
        written.append(position)
        await write_behind(self, wb, position, at_ms)

    monkeypatch.setattr(ClaimStore, "_write_behind", spy)
    a1, a2, b = resolved("sched_a", 1, NOW), resolved("sched_a", 2, NOW), resolved("sched_b", 1, NOW)
    c = resolved("sched_c", 3, NOW)
    # Within one gathered write: a put, a tombstone and a later put of one key (the last wins),
    # and a key put then tombstoned (gone); then 13 more identities over later writes.
    records = [rec(a1), rec(b), Rec(b"sched_a", None), rec(c), rec(a2), Rec(b"sched_b", None),
               Rec(b"sched_c", b"\x00x")]
    records += [rec(resolved(f"sched_{i:02d}", 1, NOW)) for i in range(13)]
    metrics = Metrics("s")
    store = ClaimStore(env, "state.t", 0)
    await store.in_thread(store.wipe, IDENT)
    progress = Progress(metrics, "state.t", 0, 0, len(records), "cold")
    await store.catch_up(FakeReader(records), 0, len(records), progress)  # type: ignore[arg-type]
    assert written == [9, 18, 20]  # pages of 3 gathered to at least 7, then the rest
    assert metrics.counters["restore_records{partition=0}"] == 20
    assert metrics.gauges["restore_remaining{partition=0}"] == 0
    assert store.get("sched_a") == a2 and store.get("sched_b") == ClaimState("sched_b")
    assert store.get("sched_c") == c and store.corrupt == 1  # the bad record kept c's snapshot
    assert store.get("sched_12") == resolved("sched_12", 1, NOW)
    assert store.restored_records == 19 and store.read_checkpoint() == (20, store.checkpoint_at_ms)
    store.close()


def test_restore_pages_stay_under_the_collectors_youngest_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from streamsched.kafka import changelog

    monkeypatch.setattr(gc, "get_threshold", lambda: (700, 10, 10))
    assert changelog.page_size() == 233  # two pages alive at once stay under 700 objects
    monkeypatch.setattr(gc, "get_threshold", lambda: (30, 10, 10))
    assert changelog.page_size() == changelog.PAGE_RECORDS_MIN
    monkeypatch.setattr(gc, "get_threshold", lambda: (100_000, 10, 10))
    assert changelog.page_size() == changelog.PAGE_RECORDS_MAX
    monkeypatch.setattr(gc, "get_threshold", lambda: (700, 10, 10))
    monkeypatch.setattr(gc, "isenabled", lambda: False)
    assert changelog.page_size() == changelog.PAGE_RECORDS_MAX  # no collector: pages as big as fetches


async def test_checkpoint_moves_by_records_plus_marker_and_survives_reopen(env: StoreEnv) -> None:
    store = await restored(env, [rec(resolved(f"sched_{i}", 1, NOW)) for i in range(5)])
    assert store.offset == 5
    claim = store.get("sched_new").acquire(owner="w", now_ns=NOW, duration_ns=10, expected_revision=0)
    store.stage()
    store.put(claim)
    store.commit_staged()
    assert store.offset == 5 + 1 + 1  # one record and its commit marker
    store.stage(3)
    store.discard_staged()  # an aborted transaction counts nothing
    store.commit_staged()  # a transaction without state records: no marker on this partition
    assert store.offset == 7
    store.close()

    again = ClaimStore(env, "state.t", 0)
    assert await again.in_thread(again.open_existing)
    assert again.read_checkpoint() is not None and again.read_checkpoint()[0] == 7  # type: ignore[index]
    assert again.get("sched_new") == claim and again.get("sched_3").fence == 1
    assert again.distrust(IDENT, Bounds(0, 7), int(time.time() * 1000)) is None
    again.close()


async def test_a_store_is_distrusted_unless_the_changelog_confirms_it(env: StoreEnv) -> None:
    store = await restored(env, [rec(resolved(f"sched_{i}", 1, NOW)) for i in range(4)])
    now_ms = int(time.time() * 1000)
    assert store.distrust(IDENT, Bounds(0, 4), now_ms) is None
    assert store.distrust(IDENT, Bounds(0, 9), now_ms) is None  # a tail to read
    # Ahead of this very topic's end: a stale read (the restore refuses it), never a cold restore.
    with pytest.raises(ChangelogBehind, match=r"\(3\) is behind offset 4"):
        store.distrust(IDENT, Bounds(0, 3), now_ms)
    elsewhere = TopicIdentity(IDENT.cluster_id, "99999999-2222-3333-4444-555555555555")
    assert "incarnation" in str(store.distrust(elsewhere, Bounds(0, 3), now_ms))  # restored cold
    assert "start" in str(store.distrust(IDENT, Bounds(5, 9), now_ms))
    other_topic = TopicIdentity(IDENT.cluster_id, "99999999-2222-3333-4444-555555555555")
    assert "incarnation" in str(store.distrust(other_topic, Bounds(0, 4), now_ms))
    assert "cluster" in str(store.distrust(TopicIdentity("cluster-b", IDENT.topic_id), Bounds(0, 4), now_ms))
    stale = now_ms + IDENT.delete_retention_ms  # tombstones written since may be purged by now
    assert "delete.retention.ms" in str(store.distrust(IDENT, Bounds(0, 4), stale))
    store.close()
    elsewhere = ClaimStore(env, "state.t", 1)
    assert not await elsewhere.in_thread(elsewhere.open_existing)  # no store at all: cold


async def test_a_store_held_by_another_owner_is_never_waited_for(env: StoreEnv) -> None:
    first = await restored(env, [rec(resolved("sched_a", 1, NOW))])
    second = ClaimStore(env, "state.t", 0)
    await second.in_thread(second.open_existing)
    assert second.ephemeral and second.path != first.path
    assert second.distrust(IDENT, Bounds(0, 1), int(time.time() * 1000)) == "no local store"  # cold
    second.close()
    assert not second.path.exists()
    first.close()


async def test_cache_is_bounded_in_bytes_and_misses_read_the_disk(env: StoreEnv) -> None:
    states_ = [resolved(f"sched_{i:05d}", 1 + i % 7, NOW) for i in range(2000)]
    store = await restored(env, [rec(s) for s in states_])
    for s in states_:
        assert store.get(s.identity) == s
        assert store._cache_size <= env.cache_bytes
    assert 0 < len(store._cache) < len(states_)
    store.close()


# --- horizon ---------------------------------------------------------------------------------------

class Writer:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    def add(self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int | None = None,
            headers: list[tuple[str, bytes]] | None = None) -> None:
        self.records.append((topic, key, value, partition))


async def make_state(kind: str, env: StoreEnv, states_: list[ClaimState]) -> StateBase:
    if kind == "disk":
        return await restored(env, [rec(s) for s in states_], horizon_s=7 * 86_400)
    mem = PartitionState(0, horizon_s=7 * 86_400)
    for s in states_:
        mem.apply_record(encode_claim(s), s.identity.encode())
    return mem


@pytest.mark.parametrize("kind", ["disk", "memory"])
async def test_horizon_tombstones_only_old_resolved_identities_and_raises_the_fence_floor(
        kind: str, env: StoreEnv) -> None:
    old = [resolved(f"sched_old{i}", 3 + i, NOW - 8 * DAY_NS) for i in range(600)]
    young = resolved("sched_young", 9, NOW - 6 * DAY_NS)
    parked = ClaimState("sched_parked", ClaimStatus.RELEASED, "", 50, 0, 1, 2)  # released, no outcome
    claimed = resolved("sched_claimed", 60, NOW - 9 * DAY_NS).acquire(
        owner="w", now_ns=NOW, duration_ns=10**12, expected_revision=180)
    state = await make_state(kind, env, [*old, young, parked, claimed])

    tombstoned: set[str] = set()
    rounds = 0
    while True:
        rounds += 1
        expiring = state.take_expired(NOW)
        if not expiring and not state.has_expired:
            if state._scan_cursor is None:
                break
            continue
        writer = Writer()
        # One of them is written by this very transaction: it is not tombstoned now.
        touched = {"sched_old0": old[0]} if rounds == 1 else {}
        state.expire(writer, "state.t", expiring, skip=touched)
        state.commit_staged()
        keys = {k.decode() for _, k, v, _ in writer.records if v is None and k is not None}
        assert not keys & set(touched)
        tombstoned |= keys
        floors = [v for _, k, v, _ in writer.records if k == FLOOR_IDENTITY.encode()]
        assert len(floors) <= 1
    assert tombstoned == {s.identity for s in old[1:]}
    assert state.fence_floor == max(s.fence for s in old[1:])
    assert state.get("sched_young") == young and state.get("sched_parked") == parked
    assert state.get("sched_claimed") == claimed
    # A replay of a tombstoned identity is a new delivery, with a fence above every old one.
    again = state.get("sched_old5")
    assert again.outcome is None and again.status is ClaimStatus.FREE
    claim = again.acquire(owner="w", now_ns=NOW, duration_ns=10, expected_revision=again.revision)
    assert claim.fence == state.fence_floor + 1 > old[5].fence
    state.close()


async def test_fence_floor_survives_reopen_and_cold_restore(env: StoreEnv) -> None:
    state = await restored(env, [rec(resolved("sched_a", 41, NOW - 30 * DAY_NS))], horizon_s=86_400)
    expiring = state.take_expired(NOW)
    writer = Writer()
    state.expire(writer, "state.t", expiring, skip={})
    state.commit_staged()
    assert state.offset == 1 + 2 + 1  # tombstone + floor + marker
    state.close()
    warm = ClaimStore(env, "state.t", 0)
    assert await warm.in_thread(warm.open_existing)
    await warm.catch_up(FakeReader([]), 4, 4, Progress(None, "state.t", 0, 4, 4, "warm"))  # type: ignore[arg-type]
    assert warm.fence_floor == 41 and warm.get("sched_a").fence == 41
    warm.close()
    # Cold, from the changelog as compaction may leave it: the floor record is what remains.
    changelog = [Rec(k, v) for _, k, v, _ in writer.records]
    cold = await restored(env, changelog, partition=2)
    assert cold.fence_floor == 41 and cold.get("sched_a") == ClaimState("sched_a", fence=41)
    cold.close()
    mem = PartitionState(0)
    for r in changelog:
        mem.apply_record(r.value, r.key)
    assert mem.fence_floor == 41 and mem.get("sched_a").fence == 41


def test_horizon_bounds() -> None:
    # Parsing the durations operators write is tests/model/test_durations.py.
    assert check_horizon(HORIZON_DEFAULT_S) == 7 * 86_400
    for bad in (59 * 60, 366 * 86_400):
        with pytest.raises(ConfigError):
            check_horizon(bad)
    with pytest.raises(ConfigError):
        PartitionState(0, horizon_s=60)


def test_run_keeps_claims_on_disk_by_default_and_memory_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.worker.intake import worker_config_from_env
    from streamsched.worker.rocksenv import MEMORY

    monkeypatch.delenv("STREAMSCHED_STORE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = worker_config_from_env("127.0.0.1:9092", default_store=True)
    assert config.store_dir == str(tmp_path / "state" / "streamsched" / "stores")
    assert Path(config.store_dir).is_dir()  # created, and checked for writing, up front
    assert worker_config_from_env("127.0.0.1:9092").store_dir is None  # the library's default
    assert worker_config_from_env("127.0.0.1:9092", default_store=True, store_dir=MEMORY).store_dir is None
    monkeypatch.setenv("STREAMSCHED_STORE_DIR", MEMORY)
    assert worker_config_from_env("127.0.0.1:9092", default_store=True).store_dir is None
    monkeypatch.setenv("STREAMSCHED_STORE_DIR", str(tmp_path / "mine"))
    assert worker_config_from_env("127.0.0.1:9092", default_store=True).store_dir == str(tmp_path / "mine")
    monkeypatch.setenv("STREAMSCHED_STORE_DIR", "")  # empty: unset, not the working directory
    assert worker_config_from_env("127.0.0.1:9092", default_store=True).store_dir == config.store_dir


def test_an_unusable_store_directory_is_a_one_line_error_before_anything_runs(tmp_path: Path) -> None:
    from streamsched.worker.intake import worker_config_from_env

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"^cannot create the claim store directory .*a-file/stores") as err:
        worker_config_from_env("127.0.0.1:9092", store_dir=str(blocker / "stores"))
    assert "\n" not in str(err.value) and ":memory:" in str(err.value)


async def test_a_transient_metadata_error_does_not_make_a_store_look_like_another_topics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The topic id decides whether a local store is trusted: an answer lost to a leader election
    # must be asked again, not read as "another incarnation" (a needless cold restore).
    from types import SimpleNamespace

    from aiokafka.errors import LeaderNotAvailableError, RequestTimedOutError, UnsupportedVersionError

    from streamsched.kafka import changelog
    from streamsched.worker.claimstore import FORMAT

    monkeypatch.setattr(changelog.asyncio, "sleep", _no_sleep)
    raw_id = bytes(range(1, 17))

    def answer(code: int) -> SimpleNamespace:
        return SimpleNamespace(cluster_id="c1", topics=[(code, "t", raw_id if code == 0 else bytes(16))])

    class Admin:
        def __init__(self, script: list[object]) -> None:
            self.script, self.asked = script, 0

        async def _send_request(self, _request: object) -> object:
            self.asked += 1
            step = self.script.pop(0)
            if isinstance(step, BaseException):
                raise step
            return step

    flaky = Admin([RequestTimedOutError(), answer(LeaderNotAvailableError.errno), answer(0)])
    assert await changelog._identity(flaky, "t") == ("c1", str(uuid.UUID(bytes=raw_id)))
    assert flaky.asked == 3
    busy = Admin([answer(LeaderNotAvailableError.errno)] * changelog.IDENTITY_ATTEMPTS)
    assert await changelog._identity(busy, "t") == ("c1", None)  # the cluster id it did get is kept
    assert busy.asked == changelog.IDENTITY_ATTEMPTS
    missing = Admin([answer(17)])  # INVALID_TOPIC_EXCEPTION: not retriable, asked once
    assert await changelog._identity(missing, "t") == ("c1", None) and missing.asked == 1
    old_broker = Admin([UnsupportedVersionError()])  # no topic ids there: not asked again
    assert await changelog._identity(old_broker, "t") == (None, None) and old_broker.asked == 1

    # A store whose topic id is known, while the cluster cannot tell it now: not trusted, and
    # the reason says so (not "another incarnation").
    head = {"format": FORMAT, "topic": "t", "partition": 0, "cluster_id": "c1", "topic_id": "x"}
    store = ClaimStore.__new__(ClaimStore)
    store.topic, store.partition = "t", 0
    monkeypatch.setattr(store, "header", lambda: head, raising=False)
    assert store.distrust(TopicIdentity("c1", None), Bounds(0, 10), 0) == (
        "the state topic's topic_id could not be read")
    assert store.distrust(TopicIdentity("c2", "x"), Bounds(0, 10), 0) == "a store of another cluster"


async def _no_sleep(_seconds: float) -> None:
    return None


async def test_private_copies_a_killed_process_left_are_removed_and_live_ones_kept(env: StoreEnv) -> None:
    import subprocess
    import sys

    import rocksdict

    first = await restored(env, [rec(resolved("sched_a", 1, NOW))])
    live = ClaimStore(env, "state.t", 0)  # this process's own private copy, open
    await live.in_thread(live.open_existing)
    assert live.ephemeral
    dead = first.path.with_name("0.deadbeef")  # left by a process that was killed
    rocksdict.Rdict(str(dead)).close()
    held = first.path.with_name("0.0badcafe")  # open in another, live process
    hold = ("import rocksdict, sys; d = rocksdict.Rdict(sys.argv[1]); print('open', flush=True); "
            "sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(held)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        other = first.path.with_name("1.deadbeef")  # another partition's: not this store's business
        other.mkdir()
        first.close()
        again = ClaimStore(env, "state.t", 0)
        assert await again.in_thread(again.open_existing)
        assert not again.ephemeral
        assert not dead.exists() and held.exists() and live.path.exists() and other.exists()
        again.close()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    live.close()
    assert not live.path.exists()


async def test_the_stores_memory_is_reported_and_bounded(env: StoreEnv) -> None:
    assert env.memory() == {}  # nothing opened: nothing to report
    records = [rec(resolved(f"sched_{i:05d}", 1, NOW)) for i in range(2_000)]
    store = await restored(env, records)
    try:
        for i in range(0, 2_000, 7):
            assert store.get(f"sched_{i:05d}").fence == 1
        used = env.memory()
        assert set(used) == {"block_cache", "memtables", "decoded"}
        assert 0 <= used["block_cache"] <= env.block_cache_bytes
        assert 0 < used["memtables"] <= env.memtable_bytes  # the restored snapshots are in a memtable
        # The lookups above decoded 286 snapshots, more than the 64 KB cache holds: it is full,
        # to within one entry, and no fuller.
        assert used["decoded"] == store.decoded_bytes
        assert env.cache_bytes - 2 * ENTRY_OVERHEAD < used["decoded"] <= env.cache_bytes
    finally:
        store.close()


async def test_the_decoded_caches_of_every_store_share_one_budget(tmp_path: Path) -> None:
    # 8 partitions owned by one worker: together they cache no more than the worker's budget
    # (each store alone once held the whole budget: 8 times as much).
    env = StoreEnv(tmp_path / "stores", cache_bytes=8 * 64 * 1024)
    stores = []
    try:
        for p in range(8):
            records = [rec(resolved(f"sched_{p}{i:05d}", 1, NOW)) for i in range(1_000)]
            stores.append(await restored(env, records, partition=p))
        for p, store in enumerate(stores):
            for i in range(1_000):
                assert store.get(f"sched_{p}{i:05d}").fence == 1
        assert env.store_cache_bytes() == 64 * 1024
        assert all(0 < s.decoded_bytes <= 64 * 1024 for s in stores)
        assert env.memory()["decoded"] <= env.cache_bytes
    finally:
        for store in stores:
            store.close()
        env.close()


def test_the_block_cache_is_sized_from_the_environment(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.worker.intake import WorkerConfig, worker_config_from_env

    monkeypatch.setenv("STREAMSCHED_STORE_BLOCK_CACHE_BYTES", "2097152")
    config = worker_config_from_env("127.0.0.1:9092", store_dir=str(tmp_path / "s"))
    assert config.store_block_cache_bytes == 2097152
    assert WorkerConfig(bootstrap="x").store_block_cache_bytes == 16 * 1024 * 1024  # the default
    monkeypatch.setenv("STREAMSCHED_STORE_BLOCK_CACHE_BYTES", "-1")
    with pytest.raises(ConfigError, match="STREAMSCHED_STORE_BLOCK_CACHE_BYTES"):
        worker_config_from_env("127.0.0.1:9092", store_dir=str(tmp_path / "s"))
