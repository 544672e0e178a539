"""``dlq list``: the newest dead letters first across partitions by record timestamp (``--oldest``
for the other order), reading only each partition's tail; and every dead letter named by its
transition record and, when it failed through the delay topic, by that parked copy too (the
table, the JSON rows). Ordering and reading on a real broker; the table's cells without one."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from streamsched.kafka import clients
from streamsched.ops import dlq_list
from streamsched.ops.cli import main
from streamsched.ops.dlq import format_dead_letters, list_dead_letters
from streamsched.wire.dead_letter import DeadLetterView, dead_letter
from streamsched.wire.delay import RecordRef
from tests.conftest import TopicFactory

DELAY = "__streamsched.delay.charges"
Key = tuple[int, int, int]
"""(record timestamp ms, partition, offset): the order ``dlq list`` promises."""


def view(*, source_offset: int, delay: RecordRef | None) -> DeadLetterView:
    return DeadLetterView(partition=1, offset=9, kind="terminal", source_topic="invoices", source_partition=1,
                          source_offset=source_offset, attempt=3, at_ns=0, reason="handler_terminal",
                          delay=delay)


# --- the table (no broker) -------------------------------------------------------------------------


def test_the_table_names_the_transition_record_and_the_parked_copy() -> None:
    table = format_dead_letters([view(source_offset=41, delay=RecordRef(DELAY, 1, 12))])
    header, row, count = table.split("\n")
    cells = dict(zip(header.replace("AT (UTC)", "AT").split(), row.split(), strict=True))
    assert (cells["SOURCE"], cells["SRC_PARTITION"], cells["SRC_OFFSET"]) == ("invoices", "1", "41")
    assert cells["VIA_DELAY"] == f"{DELAY}[1]@12" and count == "1 dead letter(s)"


def test_the_table_says_when_the_transition_record_is_not_known() -> None:
    old = view(source_offset=-1, delay=RecordRef(DELAY, 1, 12))  # a parked copy without its origin
    direct = view(source_offset=41, delay=None)
    header, row_old, row_direct, _ = format_dead_letters([old, direct]).split("\n")
    names = header.replace("AT (UTC)", "AT").split()
    cells = [dict(zip(names, r.split(), strict=True)) for r in (row_old, row_direct)]
    assert [(c["SRC_OFFSET"], c["VIA_DELAY"]) for c in cells] == [("unknown", f"{DELAY}[1]@12"), ("41", "-")]


def test_the_console_names_the_transition_record_and_the_parked_copy() -> None:
    from streamsched.ops.console.app import _environment
    from streamsched.ops.console.views import DeadLetterRow, DeadLetterTally

    def row(offset: int, source_offset: int, delay: RecordRef | None) -> DeadLetterRow:
        return DeadLetterRow(1, offset, "terminal", "invoices", 1, source_offset, 3, 1, "handler_terminal",
                             delay=delay)

    tally = DeadLetterTally("127.0.0.1:1", "__streamsched.dlq.charges", exists=True, caught_up=True)
    rows = [row(9, 41, RecordRef(DELAY, 1, 12)), row(8, -1, RecordRef(DELAY, 1, 11)), row(7, 40, None)]
    html = _environment().get_template("dlq.html").render(
        csrf="", actions=False, path="/dlq", schedulers=["charges"], catalogs=[], sampler_error=None,
        sections=[("charges", tally, rows)], errors=[], kind=None, shown=100, kept=200)
    cells = re.findall(r"<td><code>invoices\[1\]@(\w+)</code>(.*?)</td>", html)
    assert cells == [("41", f' via <code class="delay">{DELAY}[1]@12</code>'),
                     ("unknown", f' via <code class="delay">{DELAY}[1]@11</code>'), ("40", "")]


# --- ordering and reading (real broker) -----------------------------------------------------------


def letter(i: int, kind: str, *, delay: RecordRef | None = None, source_offset: int | None = None) -> Any:
    return dead_letter(kind=kind, reason="handler_terminal" if kind == "terminal" else "truncated",
                       source_topic="invoices", source_partition=0,
                       source_offset=i if source_offset is None else source_offset,
                       attempt=1, at_ns=i, original=b"o", original_key=b"k", delay=delay)


async def write_rounds(bootstrap: str, topic: str,
                       rounds: list[list[tuple[int, int, str]]]) -> dict[Key, str]:
    """Each round's (partition, timestamp, kind) records in one transaction, as the worker writes
    dead letters (every partition's offsets then hold transaction markers); their keys and kinds."""
    producer = clients.transactional_producer(bootstrap, f"dlq-list-{topic}")
    await producer.start()
    keys: dict[Key, str] = {}
    try:
        for n, batch in enumerate(rounds):
            await producer.begin_transaction()
            futures = [await producer.send(topic, letter(n, kind).value, partition=p, timestamp_ms=ts)
                       for p, ts, kind in batch]
            await producer.commit_transaction()
            for (_, ts, kind), md in zip(batch, [await f for f in futures], strict=True):
                keys[(ts, md.partition, md.offset)] = kind
        # An aborted round, newest of all: never listed.
        await producer.begin_transaction()
        await producer.send(topic, letter(99, "terminal").value, partition=1,
                            timestamp_ms=rounds[-1][0][1] + 10**6)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    return keys


def listed(views: list[DeadLetterView], by_position: dict[tuple[int, int], Key]) -> list[Key]:
    return [by_position[(v.partition, v.offset)] for v in views]


@pytest.mark.dlq
async def test_list_is_newest_first_across_partitions(bootstrap: str, make_topic: TopicFactory) -> None:
    topic = await make_topic("dlq", partitions=3, kind="dead_letter")
    base = int(time.time() * 1000) - 3_600_000
    # Partition 0 holds the oldest records, 2 the newest; 1 ties 2's timestamps in every round.
    rounds = [[(p, base + j * 30 + (10 if p else -5), "terminal" if (p + j) % 5 == 0 else "decode")
               for p in range(3)] for j in range(12)]
    kinds = await write_rounds(bootstrap, topic, rounds)
    by_position = {(p, o): (ts, p, o) for ts, p, o in kinds}
    newest, oldest = sorted(kinds, reverse=True), sorted(kinds)

    got = listed(await list_dead_letters(bootstrap, topic, limit=5), by_position)
    assert got == newest[:5]  # ties (partitions 1 and 2) in a fixed order: the higher partition first
    assert got[0][1] == 2 and got[1][1] == 1 and got[0][0] == got[1][0]
    assert listed(await list_dead_letters(bootstrap, topic, limit=5, oldest=True), by_position) == oldest[:5]
    # Newest first is exactly the reverse of oldest first; a limit past the end lists everything.
    assert listed(await list_dead_letters(bootstrap, topic, limit=1000), by_position) == newest
    assert listed(await list_dead_letters(bootstrap, topic, limit=1000, oldest=True), by_position) == oldest
    # A kind found rarely in the tail: earlier windows are read until enough are found.
    terminal = [k for k in newest if kinds[k] == "terminal"]
    assert len(terminal) >= 6
    got = listed(await list_dead_letters(bootstrap, topic, limit=6, kind="terminal"), by_position)
    assert got == terminal[:6]
    got = listed(await list_dead_letters(bootstrap, topic, limit=6, kind="terminal", oldest=True),
                 by_position)
    assert got == sorted(terminal)[:6]


@pytest.mark.dlq
async def test_newest_reads_only_the_tail_of_each_partition(bootstrap: str, make_topic: TopicFactory,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    topic = await make_topic("dlq", partitions=2, kind="dead_letter")
    producer = clients.producer(bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, letter(i, "decode").value, partition=i % 2) for i in range(600)]
        for f in futures:
            await f
    finally:
        await producer.stop()
    decoded: list[tuple[int, int]] = []
    real = dlq_list.view_dead_letter

    def counting(rec: Any) -> DeadLetterView:
        decoded.append((rec.partition, rec.offset))
        return real(rec)

    monkeypatch.setattr(dlq_list, "view_dead_letter", counting)
    views = await list_dead_letters(bootstrap, topic, limit=10)
    assert len(views) == 10
    # Per partition, only its last ``limit`` offsets (300 records each, no transactions: 290-299).
    assert sorted(decoded) == [(p, o) for p in range(2) for o in range(290, 300)]


@pytest.mark.dlq
async def test_cli_lists_newest_first_with_both_locations(bootstrap: str, make_topic: TopicFactory,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    topic = await make_topic("dlq", partitions=2, kind="dead_letter")
    base = int(time.time() * 1000) - 3_600_000
    via = RecordRef(DELAY, 1, 12)
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for i in range(4):
            await producer.send_and_wait(topic, letter(i, "decode").value, partition=0, timestamp_ms=base + i)
        old = letter(7, "terminal", delay=via, source_offset=-1)  # from a parked copy without origin
        done = letter(8, "terminal", delay=via, source_offset=41)
        for dl, ts in ((old, base + 50), (done, base + 40)):
            await producer.send_and_wait(topic, dl.value, partition=1, headers=dl.headers, timestamp_ms=ts)
    finally:
        await producer.stop()

    async def cli(*argv: str) -> str:
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["dlq", "list", "--topic", topic, "--bootstrap", bootstrap,
                                              *argv]) == 0
        return capsys.readouterr().out

    rows = json.loads(await cli("--limit", "3", "-o", "json"))
    assert [(r["partition"], r["offset"]) for r in rows] == [(1, 0), (1, 1), (0, 3)]
    first, second = rows[0], rows[1]
    assert (first["source_offset"], first["origin_known"]) == (-1, False)
    assert (second["source_topic"], second["source_offset"], second["origin_known"]) == ("invoices", 41, True)
    for r in (first, second):
        assert (r["delay_topic"], r["delay_partition"], r["delay_offset"]) == (DELAY, 1, 12)
    assert (rows[2]["delay_topic"], rows[2]["delay_offset"]) == (None, None)
    assert all("original" not in r and "original_key" not in r for r in rows)
    oldest = json.loads(await cli("--limit", "2", "--oldest", "-o", "json"))
    assert [(r["partition"], r["offset"]) for r in oldest] == [(0, 0), (0, 1)]
    table = (await cli("--limit", "2")).splitlines()
    assert "unknown" in table[1] and f"{DELAY}[1]@12" in table[1] and " 41 " in table[2]



@pytest.mark.dlq
async def test_redrive_from_the_dlq_takes_the_newest_dead_letters_and_each_identitys_latest(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    """``redrive --from-dlq``'s targets: the bound keeps the most recent dead letters (a ``--since``
    window is never crowded out by older ones), and an identity failed twice is re-driven once,
    with its latest event."""
    from streamsched import App, Selection, Turn
    from streamsched.ops.redrive import targets_from_dlq
    from streamsched.testing import make_event
    from streamsched.wire.transition import encode_transition

    app = App("dlqtargets")
    name = unique("charges")

    @app.scheduler(name=name, topic="invoices", selection=Selection("due", type="due"), commands=[])
    async def handle(turn: Turn) -> None:
        return None

    sched = app.schedulers[name]
    topic = await make_topic(kind="dead_letter", name=sched.dead_letter_topic)
    events = [make_event("due", "t", [f"run-{i}"], due_ns=1) for i in range(6)]
    again = make_event("due", "t", ["run-5"], due_ns=1)  # run-5 published again and failed: its latest
    producer = clients.transactional_producer(bootstrap, f"dlq-targets-{topic}")
    await producer.start()
    try:
        for at, ev in enumerate([*events, again]):
            await producer.begin_transaction()
            dl = dead_letter(kind="terminal", reason="handler_terminal", source_topic="invoices",
                             source_partition=0, source_offset=at, attempt=1, at_ns=(at + 1) * 10**9,
                             original=encode_transition(ev), original_key=b"k")
            await producer.send(topic, dl.value, partition=0, headers=dl.headers)
            await producer.commit_transaction()
    finally:
        await producer.stop()

    got = await targets_from_dlq(bootstrap, sched, limit=3, since_ns=4 * 10**9)
    # The newest three are run-4, run-5 and run-5 again: run-5 once, with its latest event.
    assert [t.event.target for t in got] == [("run-4",), ("run-5",)]
    assert got[1].event.event_id == again.event_id
    everything = await targets_from_dlq(bootstrap, sched, limit=100)
    assert [t.event.target for t in everything] == [(f"run-{i}",) for i in range(6)]
