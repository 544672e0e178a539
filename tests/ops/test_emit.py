"""`streamsched emit` produces through streamsched.Producer: route key, home partition, refusals."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.identity import route_key
from streamsched.ops.broker import free_port
from streamsched.ops.cli import main
from streamsched.wire.transition import decode_transition

ROOT = Path(__file__).resolve().parents[2]


async def test_emit_writes_to_the_home_partition(bootstrap: str, make_topic,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    topic = await make_topic("emit", partitions=8)
    key = route_key("acme", ("inv-42",))
    doc = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-42"], "payload": {"n": 1}})
    # main() runs its own event loop: give it a thread.
    assert await asyncio.to_thread(main, ["emit", topic, "--event", doc, "--bootstrap", bootstrap]) == 0
    assert await asyncio.to_thread(main, ["emit", topic, "--event", doc, "--key", key.decode(),
                                          "--bootstrap", bootstrap]) == 0
    outs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["partition"] for o in outs] == [partition_for_key(key, 8)] * 2
    assert [o["offset"] for o in outs] == [0, 1]
    records = await read_topic(bootstrap, topic)
    home = outs[0]["partition"]
    assert [(r.partition, r.offset) for r in records] == [(home, 0), (home, 1)]
    for rec, out in zip(records, outs, strict=True):
        ev = decode_transition(rec.value)
        assert rec.key == key and ev.event_id == out["event_id"]
        assert (ev.type, ev.tenant, ev.target, ev.json()) == ("due", "acme", ("inv-42",), {"n": 1})


def test_emit_refuses_a_key_other_than_the_route_key(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["emit", "t", "--event", '{"type":"due","tenant":"a","target":["x"]}', "--key", "other",
                 "--bootstrap", f"127.0.0.1:{free_port()}"])
    assert code == 2 and "--key must be the event's route key" in capsys.readouterr().err


@pytest.mark.parametrize(("doc", "error"), [
    ({"type": "t" * 65}, "DecodeError: encode: bound: type"),
    ({"type": "due", "target": ["c"] * 9}, "DecodeError: encode: bound: target components"),
    ({"type": "due", "tenant": "x" * 257}, "BoundExceeded: tenant bytes"),
    ({"type": "due", "origin": "retry"}, "DecodeError: encode: origin: malformed"),
])
def test_emit_refuses_invalid_events_before_connecting(doc: dict[str, object], error: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # An unreachable bootstrap would exit 3: exit 2 shows nothing was sent or even attempted.
    code = main(["emit", "t", "--event", json.dumps(doc), "--bootstrap", f"127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and error in err and "Traceback" not in err


def test_emit_to_a_missing_topic_is_one_line_exit_2(bootstrap: str, unique, tmp_path) -> None:
    # A missing topic is bad input, said at once: the producer alone would wait out its metadata
    # timeout (a warning on every retry), then call Kafka unreachable.
    topic = unique("missing")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    env["PYTHONPATH"] = str(ROOT)
    doc = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-1"]})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "streamsched", "emit", topic, "--event", doc,
                           "--bootstrap", bootstrap], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    took = time.monotonic() - started
    assert (proc.returncode, proc.stderr) == (2, f"streamsched: ConfigError: topic {topic} does not exist\n")
    assert took < 15, took  # a Python start-up and one metadata request (the old wait was 40 s)
