"""The fault matrix's judge of the workers' logs: every error line, every traceback and every
partition owner's failure must be one the scenario's fault explains, and owners restart no more
often than the scenario's stated bound.

A log is read as *records*: a line stamped with its time, and the lines under it without one (a
traceback, asyncio's ``future: ...``). A record's traceback is judged with its line, never
apart: an allowance names a whole record (:func:`record_text`: its line, then each traceback
of its chain as ``file:function > ... => exception``), and matches it entirely. So an allowance
for a line without a traceback never lets one through, and one for a traceback names the path
that raised it, not just its last line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
"""How a record starts (streamsched's text log format)."""
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) ")
OWNER_FAILED = re.compile(r" owner of \S+\[\d+\] failed: (?P<type>\w+)")
"""A partition owner's failure (streamsched.kafka.owner): a routine one at WARNING (the type
and why), an unexpected one at ERROR with its traceback. Judged at any level."""
_FRAME = re.compile(r'  File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')
_SNAPSHOT = '{"scheduler"'
_RESTART = re.compile(r" restarting \S+\[\d+\] in [\d.]+s \(failure \d+\)")
BAD_LOG = ("was never retrieved", "Task was destroyed but it is pending")
"""Never explained: a task or future that failed and nobody looked."""

EXPECTED_ERRORS = re.compile("|".join([
    # aiokafka, while a coordinator or a node is unreachable or moves (seen in these scenarios):
    r"ERROR aiokafka(\.\S+)? (Group Coordinator Request failed: \[Error 15\]"
    r"|Heartbeat session expired|Unable connect to node with id \d+"
    r"|Unable to update metadata from|Unable to request metadata from)",
    # ...and a request to it (a fetch, a heartbeat, a coordinator lookup) that the client's
    # request bound ended (kafka/compat.bound_requests) or that it did not send because the node
    # was just skipped as unresponsive, or because the metadata no longer lists it (a broker cut
    # off from the others is fenced, and its coordinators are looked up again elsewhere):
    r"ERROR aiokafka(\.\S+)? (Failed fetch messages from \d+: (\[Error 7\] RequestTimedOutError"
    r"|NodeNotReadyError)|Error sending HeartbeatRequest to node \d+ \[(\[Error 7\] RequestTimedOutError\]"
    r"|NodeNotReadyError: )|Error sending (JoinGroup|SyncGroup|OffsetCommit|LeaveGroup)Request to node \d+ "
    r"\[NodeNotReadyError: "
    r"|Heartbeat send request failed: (\[Error 7\] RequestTimedOutError|NodeNotReadyError: )"
    r"|Group Coordinator Request failed: (NodeNotReadyError|\[Error 7\] RequestTimedOutError))",
]))
"""ERROR lines (without a traceback) a network fault explains, in every scenario."""
EXPECTED_RAISES = re.compile(r"^(aiokafka\.errors\.)?(KafkaConnectionError|RequestTimedOutError"
                             r"|NodeNotReadyError|GroupCoordinatorNotAvailableError)\b")
"""What a traceback under a line that is no error (and no owner failure) may end in, in every
scenario: a connection-level Kafka error. ``KafkaTimeoutError`` is not one of them: it is a
bound a client gave up at (a send waiting for a leader, a fetch of offsets), which only a
broker or a network fault explains; where one does, it is an owner's routine failure
(:data:`BROKER_FAULT_OWNERS`)."""


def one_line(*patterns: str) -> str:
    """A record of one line (no traceback) containing one of ``patterns``."""
    return "|".join(rf".*(?:{p}).*" for p in patterns)


def routine_owner_failures(*types: str) -> str:
    """An owner's routine failure of one of ``types`` (its WARNING line, no traceback)."""
    return one_line(rf" owner of \S+\[\d+\] failed: (?:{'|'.join(types)})\b")


BROKER_DOWN_ERRORS = re.compile(one_line(
    r"ERROR aiokafka Unable connect to \"[\d.]+:\d+\": \[Errno 111\] Connect call failed",
    r"ERROR aiokafka(\.\S+)? (Failed fetch messages from \d+: |Error sending HeartbeatRequest to node \d+ \["
    r"|Heartbeat send request failed: )KafkaConnectionError: Connection at [\d.]+:\d+ closed",
))
"""What a killed broker adds to :data:`EXPECTED_ERRORS`: its address refuses connections (aiokafka
logs each bootstrap attempt to it by address; as ``node with id N`` once it knows the node,
already expected), and the connections it had open close under a fetch or a heartbeat. Only
the broker scenarios allow these: a network cut drops packets, it neither refuses nor closes,
and a heartbeat to a node cut off times out instead (expected above)."""

BROKER_FAULT_OWNERS = re.compile(routine_owner_failures(
    "KafkaTimeoutError", "RequestTimedOutError", "KafkaConnectionError", "NodeNotReadyError",
    "NotLeaderForPartitionError", "LeaderNotAvailableError", "NotEnoughReplicasError",
    "NotEnoughReplicasAfterAppendError", "NotCoordinatorError", "CoordinatorNotAvailableError",
    "TransactionStuck", "TimeoutError"))
"""Owner failures a broker or a network fault explains (routine: WARNING, no traceback): a
request to a node that went away timed out or found it gone (``KafkaTimeoutError`` is a send
or an offsets fetch that waited for a leader past its bound), a leader or coordinator moved,
too few replicas in sync while one is down, or a transaction the lost node held given up at
its deadline (``TransactionStuck``). None of these may happen where no broker fails (the
rebalance storm, the clock and disk scenarios)."""

END_TXN_UNKNOWN = (r"sender\.py:_sender_routine > sender\.py:_do_txn_commit > sender\.py:do"
                   r" > sender\.py:handle_response => (?:aiokafka\.errors\.)?UnknownError\b.*")
"""The traceback of an EndTxn answered with UNKNOWN_SERVER_ERROR, as aiokafka 0.14 raises it:
the sender routine's transaction task (``_do_txn_commit``) sends the EndTxn and its handler
raises the answer's error. Any other request answered so (an AddPartitionsToTxn, a
TxnOffsetCommit) raises through another task and is not this."""
CUT_BROKER_ERRORS = re.compile("|".join([
    one_line(r"ERROR aiokafka\.producer\.sender Could not end transaction due to unexpected error: "
             r"<class 'aiokafka\.errors\.UnknownError'>"),
    r".* ERROR aiokafka\.producer\.sender Unexpected error in sender routine\n" + END_TXN_UNKNOWN,
    # The owner whose producer that was fails (KafkaError "Unexpected error during batch
    # delivery", caused by it) and restarts with a fresh producer: unexpected by type, so with
    # its traceback, whose cause must be that EndTxn.
    r".* ERROR \S+ owner of \S+\[\d+\] failed: KafkaError\n" + END_TXN_UNKNOWN
    + r"\n.* > sender\.py:_sender_routine => (?:aiokafka\.errors\.)?KafkaError\b.*",
    # A restore refused for a state-topic end read from the cut-off broker's stale log.
    routine_owner_failures("ChangelogBehind"),
    # A position reset asked of the cut-off broker, which a client's metadata (read from that
    # broker) still names as the leader: it answers NOT_LEADER, the consumer forces a metadata
    # update and asks again (kafka/clients._refresh_metadata_on_offset_errors).
    one_line(r"ERROR aiokafka\.consumer\.fetcher Failed fetch offsets from \d+: "
             r"\[Error 6\] NotLeaderForPartitionError: "),
]))
"""What a broker cut off from the others adds: while it still takes itself for a transaction
coordinator it can answer an EndTxn with UNKNOWN_SERVER_ERROR, which ends aiokafka's sender
routine (the Java client fails the producer too); the owner then fails and restarts with a
fresh producer. Only an EndTxn may end the routine so (:data:`END_TXN_UNKNOWN`: the traceback
must show that path, not just its last line), and an owner failing of it must show that cause
(a bare ``UnknownError`` owner failure, whose path no traceback shows, is not explained). And
while it still serves its old log, a restore that read the end of a state partition from it is
refused (``ChangelogBehind``) and retried, and a consumer resetting a position there is told
NOT_LEADER until its metadata comes from another broker."""

INJECTED_OWNER_FAULTS = re.compile(routine_owner_failures("InjectedFault"))
"""The rebalance storm's owners fail on purpose (``STREAMSCHED_OWNER_FAULTS``)."""


@dataclass(frozen=True)
class LogRecord:
    """One stamped line and the lines under it (see the module docs)."""

    lines: tuple[str, ...]
    tracebacks: tuple[str, ...]
    """Each traceback of the chain under the line, in the order printed (the cause first), as
    ``file:function > ... => exception line``."""
    parsed: bool = True
    """False when a traceback could not be read (an exception group's, a cut-off one): such a
    record is never explained."""

    @property
    def head(self) -> str:
        return self.lines[0]

    @property
    def text(self) -> str:
        """What an allowance matches: the line, then each traceback on its own line."""
        return "\n".join((self.head, *self.tracebacks))


def log_records(text: str) -> list[LogRecord]:
    """``text`` as :class:`LogRecord`\\ s (a line before the first stamped one starts its own)."""
    groups: list[list[str]] = []
    for line in text.splitlines():
        if not groups or STAMPED.match(line) or line.startswith(_SNAPSHOT):
            groups.append([line])
        else:
            groups[-1].append(line)
    return [_record(g) for g in groups]


def _record(lines: list[str]) -> LogRecord:
    tracebacks: list[str] = []
    frames: list[str] | None = None
    parsed = True
    headless = lines[0].startswith("Traceback")  # a log's first lines, or stderr's own
    for line in lines if headless else lines[1:]:
        if line.startswith("Traceback (most recent call last)"):
            if frames is not None:
                parsed = False  # a traceback without its exception line
            frames = []
        elif "Traceback (most recent call last)" in line:
            parsed = False  # an exception group's (indented, in boxes)
        elif frames is not None:
            frame = _FRAME.match(line)
            if frame is not None:
                frames.append(f"{PurePath(frame['path']).name}:{frame['func']}")
            elif line and not line.startswith((" ", "\t")):
                tracebacks.append(f"{' > '.join(frames)} => {line}")
                frames = None
    return LogRecord(tuple(lines), tuple(tracebacks), parsed and frames is None)


def unexpected_log_lines(text: str, *, allow: Iterable[re.Pattern[str]] = (),
                         owners_only: bool = False) -> list[str]:
    """What no expected fault explains: any ``... was never retrieved`` line; any ERROR/CRITICAL
    line not in :data:`EXPECTED_ERRORS`; any owner failure; any traceback not ending in a
    connection-level error (:data:`EXPECTED_RAISES`) -- unless one of ``allow`` (what the
    scenario's own fault explains, e.g. :data:`BROKER_DOWN_ERRORS`) matches the whole record.
    ``owners_only``: only the owner failures (and their tracebacks) are judged. Each finding is
    a line, or ``Traceback ... <exception line>``."""
    allowed = tuple(allow)
    bad: list[str] = []
    for rec in log_records(text):
        if owners_only and not OWNER_FAILED.search(rec.head):
            continue
        never = [line for line in rec.lines if any(b in line for b in BAD_LOG)]
        bad += never
        if not never and rec.parsed and any(p.fullmatch(rec.text) for p in allowed):
            continue
        if not never and (OWNER_FAILED.search(rec.head) or (
                ERROR_LINE.search(rec.head) and not EXPECTED_ERRORS.search(rec.head))):
            bad.append(rec.head)
        bad += [f"Traceback (most recent call last): ... {tb.partition(' => ')[2]}" for tb in rec.tracebacks
                if not EXPECTED_RAISES.search(tb.partition(" => ")[2])]
        if not rec.parsed:
            bad.append(f"an unreadable traceback under: {rec.head}")
    return bad


def owner_restarts(text: str) -> int:
    """Partition owner restarts one worker's log shows. A process that stopped cleanly printed
    its metrics on exit (``streamsched run``: one snapshot per scheduler): its
    ``partition_restarts`` counter. A process killed before that (what follows the last
    snapshot) counts the restarts it scheduled (``restarting T[p] in ...``); a revoke may have
    cancelled some, so that count is an upper bound."""
    counted = scheduled = 0
    for line in text.splitlines():
        if line.startswith(_SNAPSHOT):
            counted += int(json.loads(line)["counters"].get("partition_restarts", 0))
            scheduled = 0
        elif _RESTART.search(line):
            scheduled += 1
    return counted + scheduled


@dataclass(frozen=True)
class RestartBound:
    """At most ``most`` owner restarts over a scenario's workers, and why that many."""

    most: int
    why: str


def judge_logs(logs: Mapping[str, str], *, restarts: RestartBound, allow: Iterable[re.Pattern[str]] = (),
               owners_only: bool = False) -> dict[str, int]:
    """Assert every worker log (name -> text) clean (:func:`unexpected_log_lines`) and the
    scenario's owner restarts within ``restarts``; the restarts per worker (for the result)."""
    allowed = tuple(allow)
    for name, text in logs.items():
        bad = unexpected_log_lines(text, allow=allowed, owners_only=owners_only)
        assert not bad, f"{name}: unexpected error lines:\n" + "\n".join(bad[:20])
    counts = {name: owner_restarts(text) for name, text in logs.items()}
    assert sum(counts.values()) <= restarts.most, (
        f"{sum(counts.values())} owner restarts {counts}, more than {restarts.most}: {restarts.why}")
    return counts
