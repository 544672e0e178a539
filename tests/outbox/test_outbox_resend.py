"""Delivered intents kept for a re-send (``keep_delivered_s``, ``outbox resend``), on both
backends: after a failover the events a mirror had not carried are sent again from the outbox,
with their event ids and bytes unchanged; the window is a bound, and without one nothing is kept."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from outbox_support import Backend, enqueue, prepare, service_tx

from streamsched.outbox import Intent, Outbox
from streamsched.testing import make_event
from streamsched.wire.transition import decode_transition

ROOT = Path(__file__).resolve().parents[2]


class Sink:
    def __init__(self) -> None:
        self.got: list[Intent] = []

    async def __call__(self, intent: Intent) -> None:
        self.got.append(intent)


async def drain(outbox: Outbox, sink: Sink) -> None:
    while await outbox.run_once("relay-a", sink):
        pass


async def test_kept_intents_are_sent_again_unchanged(backend: Backend, table: str) -> None:
    events = [make_event("due", "acme", [f"inv-{i}"], due_ns=i, payload={"n": i}) for i in range(4)]
    async with prepare(backend, table, keep_delivered_s=3600) as outbox:
        enqueue(backend, outbox, events[:2])
        first = Sink()
        await drain(outbox, first)
        between = time.time_ns()
        enqueue(backend, outbox, events[2:], topic="invoices")
        await drain(outbox, first)
        assert await outbox.kept_count() == 4
        assert (await outbox.counts()).pending == 0  # delivered is still gone from the backlog

        # Delivered since `between`: the last two only; a topic narrows it further.
        assert (await outbox.resend(between, topic="orders")).resent == 0
        assert (await outbox.resend(between)).resent == 2
        again = Sink()
        await drain(outbox, again)
        assert [decode_transition(i.value) for i in again.got] == events[2:]
        assert [i.idempotency_key for i in again.got] == [e.event_id for e in events[2:]]
        assert [(i.topic, i.attempt) for i in again.got] == [("invoices", 1), ("invoices", 1)]
        assert await outbox.kept_count() == 4  # delivered again: kept again

        assert (await outbox.resend(0)).resent == 4
        await drain(outbox, again)
        assert len(again.got) == 6


async def test_the_window_drops_older_intents(backend: Backend, table: str) -> None:
    async with prepare(backend, table, keep_delivered_s=60) as outbox:
        enqueue(backend, outbox, [make_event("due", "acme", ["old"])])
        await drain(outbox, Sink())
        with service_tx(backend) as conn:  # delivered two minutes ago, as the window sees it
            conn.execute(f"UPDATE {table}_sent SET delivered_ns = delivered_ns - 120000000000")
        enqueue(backend, outbox, [make_event("due", "acme", ["new"])])
        await drain(outbox, Sink())  # this ack drops what is older than the window
        assert await outbox.kept_count() == 1
        oldest = await outbox.resend(0)
        assert oldest.resent == 1 and oldest.oldest_kept_ns is not None


async def test_without_a_window_nothing_is_kept(backend: Backend, table: str) -> None:
    async with prepare(backend, table) as outbox:
        enqueue(backend, outbox, [make_event("due", "acme", ["x"])])
        await drain(outbox, Sink())
        assert await outbox.kept_count() == 0
        assert (await outbox.resend(0)).resent == 0


async def test_a_table_made_before_kept_intents_gains_their_table(backend: Backend, table: str) -> None:
    async with prepare(backend, table) as outbox:
        with service_tx(backend) as conn:  # as an older release created it
            conn.execute(f"DROP TABLE {table}_sent")
        assert await outbox.kept_count() == 0 and (await outbox.resend(0)).resent == 0
        enqueue(backend, outbox, [make_event("due", "acme", ["x"])])
    async with Outbox(backend.dsn, table=table, keep_delivered_s=600) as relay:
        sink = Sink()
        await drain(relay, sink)
        assert len(sink.got) == 1  # delivered once, acked, and kept
        assert await relay.kept_count() == 1
        assert (await relay.counts()).dead == 0


async def test_resend_command(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'o.db'}"
    backend = Backend("sqlite", dsn, lambda: sqlite3.connect(tmp_path / "o.db"))
    async with prepare(backend, "streamsched_outbox", keep_delivered_s=600) as outbox:
        enqueue(backend, outbox, [make_event("due", "acme", ["a"]), make_event("due", "acme", ["b"])])
        await drain(outbox, Sink())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streamsched", "outbox", *args, "--dsn", dsn],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)

    assert json.loads(cli("status").stdout)["kept"] == 2
    resent = cli("resend", "--since", "10m")
    assert resent.returncode == 0, resent.stderr
    assert json.loads(resent.stdout)["resent"] == 2
    assert json.loads(cli("status").stdout)["pending"] == 2
    async with Outbox(dsn, keep_delivered_s=600) as relay:
        await drain(relay, Sink())  # delivered again: kept again
    # Kept deliveries start after --since: the command says the window may not reach back.
    early = cli("resend", "--since", "2000-01-01T00:00:00Z")
    assert early.returncode == 0 and json.loads(early.stdout)["resent"] == 2
    assert "warning: the oldest delivery still kept is after --since" in early.stderr
    bad = cli("resend", "--since", "yesterday")
    assert bad.returncode == 2 and "--since expects an ISO 8601 time" in bad.stderr
