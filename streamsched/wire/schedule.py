"""Wire formats of the schedule catalog, and the ``origin`` a fired event carries.

Definitions, states and history rows are Avro records (schema ids 4, 5, 6). A fired event's
``origin`` (written by the ticker, read back by target workers to report an attempt's result on
the catalog's feedback topic) is ``sched:<catalog>:<name>:<version>:<planned_ns>``; the writer
:func:`occurrence_origin` and the reader :func:`parse_origin` live here together.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamsched.model.schedule import Definition
from streamsched.wire.avro import AvroCodec

DEFINITION_CODEC = AvroCodec("schedule_definition")
STATE_CODEC = AvroCodec("schedule_state")
HISTORY_CODEC = AvroCodec("history")
ORIGIN_PREFIX = "sched:"


def occurrence_origin(catalog: str, defn: Definition, planned_ns: int) -> str:
    """The ``origin`` of a fired event: ``sched:<catalog>:<name>:<version>:<planned_ns>``.

    ``<schedule-id>/<planned-ns>`` is the occurrence's stable identity; the target worker
    reads the origin to report the attempt's result back to the catalog.
    """
    return f"{ORIGIN_PREFIX}{catalog}:{defn.name}:{defn.version}:{planned_ns}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    catalog: str
    name: str
    version: int
    planned_ns: int

    @property
    def schedule_id(self) -> str:
        return f"{self.name}.v{self.version}"

    @property
    def occurrence(self) -> str:
        return f"{self.schedule_id}/{self.planned_ns}"


def parse_origin(origin: str | None) -> Occurrence | None:
    if not origin or not origin.startswith(ORIGIN_PREFIX):
        return None
    parts = origin[len(ORIGIN_PREFIX):].split(":")
    if len(parts) != 4:
        return None
    try:
        return Occurrence(parts[0], parts[1], int(parts[2]), int(parts[3]))
    except ValueError:
        return None
