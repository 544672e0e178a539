"""Generate docs/wire-vectors.json: test vectors of the wire contract (docs/wire-contract.md).

Every value in the file is computed by streamsched itself (``encode_transition``, ``route_key``,
``partition_for_key``); the route-key pre-image is built here from the written specification
(:func:`spec_route_key_preimage`), so tests/wire/test_wire_vectors.py proves the document and
the code agree. Producers in other languages load the file and check their own output.

    .venv/bin/python scripts/gen_wire_vectors.py          # rewrite docs/wire-vectors.json
    .venv/bin/python scripts/gen_wire_vectors.py --check  # exit 1 if the file is out of date
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamsched.errors import BoundExceeded, DecodeError, InvalidName  # noqa: E402
from streamsched.kafka.producer import encode_event  # noqa: E402
from streamsched.kafka.writer import partition_for_key  # noqa: E402
from streamsched.model.event import TransitionEvent  # noqa: E402
from streamsched.model.identity import route_key  # noqa: E402

OUT = ROOT / "docs" / "wire-vectors.json"
PARTITION_COUNTS = (1, 3, 8, 12, 64)
ROUTE_DOMAIN = b"streamsched/route-key/v1\x00"

# Kafka's own murmur2 vectors (org.apache.kafka.common.utils.UtilsTest#testMurmur2): signed
# 32-bit results of Utils.murmur2 for these byte strings.
KAFKA_MURMUR2 = (
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
)

BASE: dict[str, Any] = {
    "event_id": "evt-0001", "type": "due", "tenant": "acme", "target": ["inv-42"], "due_ns": 0,
    "payload": "{}", "produced_ns": 1767225600000000000, "attempt": 1, "origin": None,
}

# (name, fields that differ from BASE). The payload is given as text: its UTF-8 bytes are the
# exact Avro ``bytes`` value (streamsched never re-serializes a payload it receives).
VALID: tuple[tuple[str, dict[str, Any]], ...] = (
    ("minimal", {"tenant": "", "target": [], "payload": "{}"}),
    ("typical", {"payload": '{"amount":1250,"currency":"EUR"}'}),
    ("three-components", {"event_id": "evt-0003", "tenant": "tenant-7",
                          "target": ["order", "2024-000123", "line-3"], "due_ns": 1767225600000000000}),
    ("empty-component", {"tenant": "t", "target": [""]}),
    ("two-empty-components", {"tenant": "t", "target": ["", ""]}),
    ("unicode", {"tenant": "Zürich AG", "target": ["Ünïcødé", "日本語", "emoji-😀"],
                 "payload": '{"note":"grüße 😀"}'}),
    ("non-canonical-json-payload", {"payload": '{ "b": 1, "a": [true, null] }'}),
    ("scalar-json-payload", {"payload": "42"}),
    ("origin-and-attempt", {"type": "report", "target": ["nightly-report"], "attempt": 2,
                            "origin": "sched:default:nightly-report:3:1767225600000000000"}),
    ("max-longs", {"due_ns": 2**63 - 1, "produced_ns": -(2**63)}),
    ("max-bounds", {"event_id": "e" * 128, "type": "t" * 64, "tenant": "ü" * 128,
                    "target": ["c" * 124] * 7 + ["c" * 123], "payload": "[" * 64 + "]" * 64}),
)

INVALID: tuple[tuple[str, dict[str, Any]], ...] = (
    ("empty-event-id", {"event_id": ""}),
    ("event-id-129", {"event_id": "e" * 129}),
    ("empty-type", {"type": ""}),
    ("type-65", {"type": "t" * 65}),
    ("nine-components", {"target": ["c"] * 9}),
    ("tenant-257-bytes", {"tenant": "ü" * 128 + "x"}),
    ("canonical-target-1025-bytes", {"target": ["c" * 1020]}),
    ("component-1025-bytes", {"target": ["c" * 1025]}),
    ("negative-due", {"due_ns": -1}),
    ("attempt-0", {"attempt": 0}),
    ("payload-not-json", {"payload": "not json"}),
    ("payload-json-depth-65", {"payload": "[" * 65 + "]" * 65}),
    ("origin-malformed", {"origin": "schedule:nightly"}),
    ("origin-reserved-catalog", {"origin": "sched:__streamsched:x:1:0"}),
    ("origin-signed-version", {"origin": "sched:default:x:+1:0"}),
)


def spec_route_key_preimage(tenant: str, target: list[str]) -> bytes:
    """The bytes docs/wire-contract.md says are hashed into the route key, built from the text."""
    t = tenant.encode("utf-8")
    canonical = bytes([len(target)]) + b"".join(
        struct.pack(">I", len(c.encode("utf-8"))) + c.encode("utf-8") for c in target)
    return (ROUTE_DOMAIN + b"\x01" + struct.pack(">I", len(t)) + t
            + b"\x02" + struct.pack(">I", len(canonical)) + canonical)


def event_of(fields: dict[str, Any]) -> TransitionEvent:
    return TransitionEvent(
        event_id=fields["event_id"], type=fields["type"], tenant=fields["tenant"],
        target=tuple(fields["target"]), due_ns=fields["due_ns"], payload=fields["payload"].encode(),
        produced_ns=fields["produced_ns"], attempt=fields["attempt"], origin=fields["origin"])


def valid_vector(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    ev = event_of(fields)
    key, value = encode_event(ev)
    assert key == route_key(ev.tenant, ev.target)
    return {
        "name": name,
        "event": fields,
        "route_key_preimage_hex": spec_route_key_preimage(fields["tenant"], fields["target"]).hex(),
        "route_key": key.decode("ascii"),
        "route_key_hex": key.hex(),
        "murmur2_positive": partition_for_key(key, 2**31),
        "partitions": {str(n): partition_for_key(key, n) for n in PARTITION_COUNTS},
        "envelope_hex": value.hex(),
    }


def invalid_vector(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    try:
        encode_event(event_of(fields))
    except DecodeError as exc:
        error, detail = "DecodeError", exc.reason
    except BoundExceeded as exc:
        error, detail = "BoundExceeded", exc.bound
    except InvalidName as exc:
        error, detail = "InvalidName", exc.reason
    else:
        raise AssertionError(f"invalid vector {name!r} was accepted")
    return {"name": name, "event": fields, "error": error, "detail": detail}


def build() -> dict[str, Any]:
    return {
        "description": "streamsched wire contract test vectors; see docs/wire-contract.md",
        "generator": "scripts/gen_wire_vectors.py",
        "magic": 0xA5,
        "schema_id": 1,
        "partition_counts": list(PARTITION_COUNTS),
        "murmur2": [{"key_hex": k.hex(), "murmur2_signed": v, "murmur2_positive": v & 0x7FFFFFFF}
                    for k, v in KAFKA_MURMUR2],
        "valid": [valid_vector(name, {**BASE, **diff}) for name, diff in VALID],
        "invalid": [invalid_vector(name, {**BASE, **diff}) for name, diff in INVALID],
    }


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run scripts/gen_wire_vectors.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
