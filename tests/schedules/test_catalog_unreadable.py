"""Defect 4h (catalog part): unreadable catalog records are counted, logged and reported.

Real broker: garbage is produced straight into the catalog's compacted topics, as a foreign or
broken producer would, and read back through :class:`Catalog` and the CLI.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import pytest

from streamsched.kafka import clients
from streamsched.kafka.writer import partition_for_key
from streamsched.model.schedule import HistoryRow
from streamsched.ops import cli
from streamsched.schedules.catalog import Catalog
from streamsched.wire.schedule import HISTORY_CODEC

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]

GARBAGE = b"\x00\x00\x00\x00\x04SECRET-PAYLOAD-not-avro"
"""Not a record of any catalog schema; ``SECRET`` must never reach a log line or the CLI."""
LOGGER = "streamsched.schedules.catalog"


async def produce(catalog: Catalog, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = clients.producer(catalog.bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key,
                                         partition=partition_for_key(key, catalog.partitions))
    finally:
        await producer.stop()


def row(name: str, seq: int) -> bytes:
    planned = 1_800_000_000_000_000_000 + seq
    return HISTORY_CODEC.encode(HistoryRow(f"{name}.v1", f"{name}.v1/{planned}", planned, 1,
                                           "SUCCEEDED", planned).to_record())


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("cat"), partitions=2)
    await cat.ensure_topics()
    return cat


async def test_list_counts_unreadable_definitions_and_logs_once(
        catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    await catalog.schedule("good", "@every 1h", "target-topic")
    await catalog.schedule("kept", "@every 2h", "target-topic")
    # A garbage record under a new key, and one newer than a readable definition of "kept".
    await produce(catalog, catalog.definitions_topic, [(b"broken", GARBAGE), (b"kept", GARBAGE)])
    caplog.set_level(logging.WARNING, logger=LOGGER)

    infos = await catalog.list()

    assert [i.definition.name for i in infos] == ["good", "kept"]
    # Like the ticker: a key whose newest record is unreadable keeps its last readable one.
    assert infos[1].definition.spec == "@every 2h"
    assert infos.skipped_corrupt == 2
    # One line for the read of the definitions, none for the (clean) states topic.
    [line] = warnings_of(caplog)
    assert line.startswith(f"2 unreadable records skipped in {catalog.definitions_topic}")
    assert "partition" in line and "offset" in line
    assert "SECRET" not in caplog.text
    definitions = await catalog.definitions()
    assert set(definitions) == {"good", "kept"} and definitions.skipped_corrupt == 2


async def test_clean_reads_report_zero_and_log_nothing(
        catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    await catalog.schedule("good", "@every 1h", "target-topic")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    infos = await catalog.list()
    history = await catalog.history("good")
    assert len(infos) == 1 and infos.skipped_corrupt == 0
    assert list(history) == [] and history.skipped_corrupt == 0
    assert warnings_of(caplog) == []


async def test_history_counts_unreadable_rows_of_that_schedule(
        catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    await produce(catalog, catalog.history_topic, [
        (b"job/0", row("job", 0)),
        (b"job/1", GARBAGE),
        (b"job/2", row("job", 2)),
        (b"other/1", GARBAGE),  # another schedule's row: not job's to report
    ])
    caplog.set_level(logging.WARNING, logger=LOGGER)

    rows = await catalog.history("job")

    assert [r.planned_ns for r in rows] == [1_800_000_000_000_000_000, 1_800_000_000_000_000_002]
    assert rows.skipped_corrupt == 1
    [line] = warnings_of(caplog)
    assert line.startswith(f"1 unreadable records skipped in {catalog.history_topic}")
    assert "SECRET" not in caplog.text
    assert (await catalog.history("other")).skipped_corrupt == 1


def test_cli_list_and_history_say_how_many_records_were_skipped(
        bootstrap: str, unique: Callable[[str], str], capsys: pytest.CaptureFixture[str]) -> None:
    catalog = Catalog(bootstrap, unique("cat"), partitions=2)

    async def setup() -> None:
        await catalog.ensure_topics()
        await catalog.schedule("good", "@every 1h", "target-topic")
        await produce(catalog, catalog.definitions_topic, [(b"broken", GARBAGE)])
        await produce(catalog, catalog.history_topic, [(b"good/0", GARBAGE), (b"good/1", GARBAGE)])

    asyncio.run(setup())
    capsys.readouterr()
    common = ["--catalog", catalog.name, "--bootstrap", bootstrap]

    assert cli.main(["schedule", "list", *common]) == 0
    out, err = capsys.readouterr()
    assert "good" in out and "broken" not in out
    assert "1 unreadable records skipped" in err.splitlines()

    assert cli.main(["schedule", "list", "-o", "json", *common]) == 0
    out, err = capsys.readouterr()
    assert [r["name"] for r in json.loads(out)] == ["good"]  # stdout stays JSON
    assert "1 unreadable records skipped" in err.splitlines()

    assert cli.main(["schedule", "history", "good", *common]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "2 unreadable records skipped" in err.splitlines()
    assert "SECRET" not in out + err
