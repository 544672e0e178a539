"""What one catalog partition's ticker knows: definitions, states, held schedules and requests.

A :class:`ScheduleBook` is filled by the restore (every record of the partition's definitions
and states, in log order), then by the ticker's intake (definitions and requests as they
arrive) and by its own ticks once they commit (:meth:`ScheduleBook.adopt`): it never holds a
state that Kafka does not.

Undecodable records are never dropped silently: each is counted
(``undecodable_records{kind=definition|request|state|progress|running}``) and logged in one line
(partition and offset, never the bytes). A corrupt schedule *state* never resets its schedule:

* if a good state of the schedule precedes it in the log, that last good state is kept, with the
  request progress it carried (occurrences fired after it are fired again with the same
  identity, so target workers resolve them from their stored outcome without a second effect);
* if none does, the schedule is *held*: neither fired nor reset, counted in the gauge
  ``schedules_held{partition}``, until its definition gets a newer version than the one the
  corrupt state was written for (an operator's ``schedule add``/``enable``/``disable``), which
  resets it by design. A fresh state would fire a one-time job's passed instant a second time.
  The ticker tags every state it writes with that version (header ``ss-version``,
  :func:`~streamsched.wire.schedule.state_headers`), so the hold survives restarts and a version
  written while no ticker ran still releases it; a record without the tag is held at the
  current version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from streamsched.errors import DecodeError, InvalidSpec
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.metrics import Metrics
from streamsched.model.schedule import Definition, RequestProgress, State
from streamsched.schedules.requests import Entry, Requests
from streamsched.wire.schedule import (
    PROGRESS_HEADER,
    STATE_CODEC,
    decode_definition,
    decode_progress,
    decode_request,
    header,
    request_name,
    with_running,
    written_for,
)

log = logging.getLogger(__name__)

UNDECODABLE = (DecodeError, KeyError, ValueError, TypeError, UnicodeDecodeError)
"""What decoding a record of the catalog may raise (the codecs' own error, and the model's
``from_record`` on a body that decoded but does not make a value)."""


def undecodable(metrics: Metrics, kind: str, rec: ConsumerRecord) -> None:
    """Count and log a record of the catalog that cannot be decoded (where it is, never its bytes)."""
    metrics.inc("undecodable_records", kind=kind)
    log.warning("undecodable %s record in %s[%d] at offset %d (skipped)", kind, rec.topic, rec.partition,
                rec.offset)


def _key(rec: ConsumerRecord) -> str:
    return rec.key.decode("utf-8", "replace") if rec.key else ""


class ScheduleBook:
    """Definitions, states, held schedules and requests of one catalog partition."""

    def __init__(self, metrics: Metrics, partition: int) -> None:
        self.metrics = metrics
        self.partition = partition
        self.defs: dict[str, Definition] = {}
        self.states: dict[str, State] = {}
        self.held: dict[str, int | None] = {}
        """Schedules whose only state record is corrupt -> the definition version held."""
        self.requests = Requests()
        """Operator requests on this partition, and the offset below which all are applied."""
        self.defs_next = 0
        """The next definitions offset to read (what is applied here so far)."""
        self.fence = 1
        """Written into every state this owner writes: one more than any state restored."""
        self._corrupt: dict[str, int | None] = {}
        """Restore only: schedules whose latest state record is corrupt -> the version it was for."""
        self._progress: dict[str, tuple[RequestProgress, ...]] = {}
        """Restore only: the request progress each schedule's latest good state carried."""

    # --- the definitions partition (restore and intake) ---------------------------------------------

    def apply_definitions(self, records: Iterable[ConsumerRecord]) -> None:
        for rec in records:
            self.apply_definition(rec)

    def apply_definition(self, rec: ConsumerRecord) -> None:
        """A record of the definitions partition: a definition (or its deletion) or a request."""
        self.defs_next = max(self.defs_next, rec.offset + 1)
        key = _key(rec)
        if request_name(key) is not None:
            self._apply_request(key, rec)
            return
        if rec.value is None:
            self.defs.pop(key, None)
            return
        try:
            defn = decode_definition(rec.value, rec.headers)
            defn.parsed()
        except (*UNDECODABLE, InvalidSpec):
            undecodable(self.metrics, "definition", rec)  # the previous definition (if any) stays
            return
        self.defs[key] = defn

    def _apply_request(self, key: str, rec: ConsumerRecord) -> None:
        if rec.value is None:
            self.requests.remove(key)
            return
        try:
            req = decode_request(key, rec.value)
        except UNDECODABLE:
            undecodable(self.metrics, "request", rec)
            return
        self.requests.put(key, rec.offset, req)

    # --- the state partition (restore only) ----------------------------------------------------------

    def apply_states(self, records: Iterable[ConsumerRecord]) -> None:
        for rec in records:
            self.apply_state(rec)

    def apply_state(self, rec: ConsumerRecord) -> None:
        """A record of the state partition, as the restore reads them in log order. A tombstone
        of a key no schedule has (the read barrier's) deletes nothing."""
        key = _key(rec)
        if rec.value is None:
            self.states.pop(key, None)
            self._corrupt.pop(key, None)
            self._progress.pop(key, None)
            return
        try:
            st = State.from_record(STATE_CODEC.decode(rec.value))
        except UNDECODABLE:
            undecodable(self.metrics, "state", rec)
            self._corrupt[key] = written_for(rec.headers)  # the last good state of ``key`` (if any) stays
            return
        self.states[key] = self._read_running(st, rec)
        self._corrupt.pop(key, None)
        self._progress[key] = self._read_progress(rec)

    def _read_running(self, st: State, rec: ConsumerRecord) -> State:
        try:
            return with_running(st, rec.headers)
        except DecodeError:
            # Nothing is taken as pending: at worst one boundary fires beside an unresolved run.
            undecodable(self.metrics, "running", rec)
            return st

    def _read_progress(self, rec: ConsumerRecord) -> tuple[RequestProgress, ...]:
        raw = header(rec.headers, PROGRESS_HEADER)
        if raw is None:
            return ()
        try:
            return decode_progress(raw)
        except DecodeError:
            undecodable(self.metrics, "progress", rec)  # its requests are applied again from their start
            return ()

    def restored(self, committed: int | None, end: int) -> None:
        """Every definition and state is read (definitions to ``end``); ``committed`` is the
        group's committed offset of the definitions partition. Decides which schedules are held,
        this owner's fence, and which requests are applied or resume where they were."""
        for key, version in self._corrupt.items():
            if key in self.states:
                log.warning("schedule %r resumes from its last good state (the newer one is corrupt)", key)
                continue
            defn = self.defs.get(key)
            held = version if version is not None else (defn.version if defn is not None else None)
            if defn is not None and held is not None and defn.version > held:
                continue  # redefined since: it resets, as any new version does
            self.held[key] = held
            log.warning("schedule %r is held: its state is corrupt and no good state precedes it; "
                        "write a new version of it to reset it", key)
        self.gauge()
        self.fence = max((s.fence for s in self.states.values()), default=0) + 1
        self.defs_next = max(self.defs_next, end)
        self.requests.restored(committed)
        self.requests.resume({name: {p.request_id: p for p in items}
                              for name, items in self._progress.items()})
        self._corrupt.clear()
        self._progress.clear()

    # --- the ticks -----------------------------------------------------------------------------------

    def adopt(self, states: dict[str, State], held: dict[str, int | None], updates: Mapping[str, Entry],
              applied_to: int) -> None:
        """A tick committed: its states, holds and request entries are what Kafka holds now."""
        self.states, self.held = states, held
        for key, entry in updates.items():
            if key in self.requests.by_key:  # else deleted meanwhile
                self.requests.by_key[key] = entry
        self.requests.applied_to = max(self.requests.applied_to, applied_to)
        self.gauge()

    def gauge(self) -> None:
        self.metrics.set_gauge("schedules_held", len(self.held), partition=str(self.partition))
