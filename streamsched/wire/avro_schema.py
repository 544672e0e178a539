"""The envelope constants and the schemas of :mod:`streamsched.wire.avro`: which schema id names
which record, where the ``*.avsc`` files are, per-codec size and array bounds, and the one-time
parse of each schema (checked against the record name its id promises).

Everything here is data about the wire format; the codec itself is in :mod:`streamsched.wire.avro`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast

import fastavro

from streamsched.errors import ConfigError
from streamsched.model.limits import MAX_DEAD_LETTER_BYTES, MAX_TARGET_COMPONENTS

__all__ = ["ARRAY_BOUNDS", "INT32", "INT64", "KNOWN_IDS", "MAGIC", "SCHEMA_IDS", "SIZE_LIMITS",
           "parsed_schema", "schema_dir"]

MAGIC: Final = 0xA5
"""First byte of every encoded record."""

SCHEMA_IDS: Final[Mapping[str, int]] = {
    "transition": 1,
    "claim": 2,
    "outcome": 3,
    "schedule_definition": 4,
    "schedule_state": 5,
    "history": 6,
    "dead_letter": 7,
}
"""Codec name (and ``schemas/<name>.avsc`` file stem) to the schema-id byte."""

_RECORD_NAMES: Final[Mapping[str, str]] = {
    "transition": "dev.streamsched.TransitionEvent",
    "claim": "dev.streamsched.ClaimState",
    "outcome": "dev.streamsched.Outcome",
    "schedule_definition": "dev.streamsched.ScheduleDefinition",
    "schedule_state": "dev.streamsched.ScheduleState",
    "history": "dev.streamsched.HistoryRow",
    "dead_letter": "dev.streamsched.DeadLetter",
}
KNOWN_IDS: Final = frozenset(SCHEMA_IDS.values())
"""Every schema-id byte in use (a wrong but known id is a "schema mismatch", not "unknown")."""

SIZE_LIMITS: Final[Mapping[str, int]] = {"dead_letter": MAX_DEAD_LETTER_BYTES}
"""Encoded-size bound per codec where it differs from ``MAX_RECORD_BYTES``."""

ARRAY_BOUNDS: Final[Mapping[str, tuple[tuple[str, int, str], ...]]] = {
    "transition": (("target", MAX_TARGET_COMPONENTS, "bound: target components"),),
}
"""Per codec: (top-level array field, max items, reason). Enforced by encode and decode."""

# Inclusive ranges of Avro ``int`` and ``long``.
INT32: Final = (-(2**31), 2**31 - 1)
INT64: Final = (-(2**63), 2**63 - 1)


def schema_dir() -> Path:
    """Directory the ``*.avsc`` files are loaded from."""
    here = Path(__file__).resolve().parent
    repo = here.parent.parent / "schemas"
    packaged = here.parent / "_schemas"
    if not repo.is_dir() and packaged.is_dir():
        return packaged
    return repo


@functools.cache
def parsed_schema(name: str) -> dict[str, Any]:
    """fastavro's parse of ``schemas/<name>.avsc`` (cached); ``ConfigError`` if the file defines
    another record than the one schema id ``SCHEMA_IDS[name]`` stands for."""
    path = schema_dir() / f"{name}.avsc"
    with path.open("rb") as fh:
        raw = json.load(fh)
    parsed = cast(dict[str, Any], fastavro.parse_schema(raw, named_schemas={}))
    if parsed.get("name") != _RECORD_NAMES[name]:
        # A renamed or swapped file would otherwise pair a schema id with the wrong layout.
        raise ConfigError(f"{path.name} defines {parsed.get('name')!r}, expected {_RECORD_NAMES[name]!r}")
    return parsed
