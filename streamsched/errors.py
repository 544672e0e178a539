"""The one error root of streamsched and its typed subclasses.

Every error carries the fields a caller needs as attributes; messages never include payloads,
credentials or plaintext identities (only digests, names the operator chose, and numbers).
"""

from __future__ import annotations


class StreamschedError(Exception):
    """Root of every error streamsched raises on purpose."""

    kind: str = "error"
    outlasts_give_up: bool = False
    """A fault of the machine, not of the code or the data (a full disk): a partition owner that
    fails with it restarts with backoff for as long as it lasts, never given up
    (:class:`~streamsched.kafka.owner.RestartPolicy`)."""


class BrokerError(StreamschedError):
    """The local Kafka runner could not fetch, format, start or reach a broker."""

    kind = "broker"


class RegistryError(StreamschedError):
    """The test schema registry (streamsched.testing.registry) could not be fetched, started or
    reached, or no Java it can run on was found."""

    kind = "registry"


class ConfigError(StreamschedError):
    """A scheduler, app or CLI option is invalid."""

    kind = "config"


class InvalidName(ConfigError):
    """A schedule, topic or queue name does not match the allowed grammar."""

    kind = "invalid_name"

    def __init__(self, name_kind: str, reason: str) -> None:
        super().__init__(f"invalid {name_kind} name: {reason}")
        self.name_kind = name_kind
        self.reason = reason


class ReservedName(InvalidName):
    """A user-supplied name uses the reserved ``__streamsched`` prefix."""

    kind = "reserved_name"

    def __init__(self, name_kind: str) -> None:
        super().__init__(name_kind, "the prefix '__streamsched' is reserved")


class BoundExceeded(StreamschedError):
    """An input or option is outside its documented bound (streamsched.model.limits)."""

    kind = "bound"

    def __init__(self, bound: str, limit: int | float, actual: int | float) -> None:
        super().__init__(f"{bound} is {actual}, limit is {limit}")
        self.bound = bound
        self.limit = limit
        self.actual = actual


class InvalidSpec(StreamschedError):
    """A schedule spec does not parse; ``reason`` says why."""

    kind = "invalid_spec"

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid schedule spec: {reason}")
        self.reason = reason


class DecodeError(StreamschedError):
    """A record could not be decoded or failed schema validation (it is dead-lettered)."""

    kind = "decode"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClaimError(StreamschedError):
    """Base of claim state-machine refusals."""

    kind = "claim"


class StaleFence(ClaimError):
    """A write presented a fencing token older than the current one."""

    kind = "stale_fence"

    def __init__(self, identity: str, presented: int, current: int) -> None:
        super().__init__(f"stale fence {presented} for {identity} (current {current})")
        self.identity = identity
        self.presented = presented
        self.current = current


class RevisionConflict(ClaimError):
    """A transition presented a revision other than the exact successor revision."""

    kind = "revision_conflict"

    def __init__(self, identity: str, presented: int, expected: int) -> None:
        super().__init__(f"revision {presented} for {identity} is not the successor {expected}")
        self.identity = identity
        self.presented = presented
        self.expected = expected


class IllegalTransition(ClaimError):
    """A claim transition is not allowed from the current state."""

    kind = "illegal_transition"

    def __init__(self, identity: str, state: str, action: str) -> None:
        super().__init__(f"cannot {action} {identity} in state {state}")
        self.identity = identity
        self.state = state
        self.action = action


class LeaseHeld(ClaimError):
    """Another owner holds an unexpired lease on the identity."""

    kind = "lease_held"

    def __init__(self, identity: str, owner: str, expires_ns: int) -> None:
        super().__init__(f"{identity} is leased by another owner until {expires_ns}")
        self.identity = identity
        self.owner = owner
        self.expires_ns = expires_ns


class FencedOut(StreamschedError):
    """This worker lost the partition: its transactional producer was fenced by a newer owner."""

    kind = "fenced"

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(f"fenced out of {topic}[{partition}]")
        self.topic = topic
        self.partition = partition


class GenerationFenced(FencedOut):
    """The group coordinator refused a transaction's offsets: they carried a consumer-group
    generation the group has moved on from (``reason`` is Kafka's error: ILLEGAL_GENERATION,
    UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID; or the member was not in the group at all). The
    transaction can only abort, so nothing a zombie member wrote becomes visible. A fencing like
    the producer's: ``topic``/``partition`` is the first offset refused, ``generation`` the one
    sent (-1: none)."""

    kind = "generation_fenced"

    def __init__(self, topic: str, partition: int, group: str, generation: int, reason: str) -> None:
        StreamschedError.__init__(self, f"offsets of {topic}[{partition}] refused by group {group!r} "
                                        f"for generation {generation}: {reason}")
        self.topic = topic
        self.partition = partition
        self.group = group
        self.generation = generation
        self.reason = reason


class OffsetsNotStable(StreamschedError):
    """A group's committed offsets could not be read as stable within the deadline: a transaction
    still held offsets pending for a partition (UNSTABLE_OFFSET_COMMIT: the previous owner's
    transaction had not ended) or the group coordinator did not answer. Starting from the offset
    committed before that transaction could handle its records twice; ``reason`` is the last
    answer (a Kafka error name)."""

    kind = "offsets_not_stable"

    def __init__(self, group: str, reason: str) -> None:
        super().__init__(f"committed offsets of group {group!r} are not stable: {reason}")
        self.group = group
        self.reason = reason


class TransactionStuck(StreamschedError):
    """A partition owner's transaction did not commit within its deadline; the owner restarts
    with a fresh producer."""

    kind = "transaction_stuck"


class RoundAborted(StreamschedError):
    """The transaction a partition owner shared with the member's other partitions aborted
    (another partition's write failed, or its owner stopped): nothing of it is visible, and the
    owner restarts from committed state."""

    kind = "round_aborted"


class ChangelogBehind(StreamschedError):
    """The state topic's end, as read for a restore, is behind an offset this worker knows was
    committed (its read barrier's, or its own store's checkpoint of the same topic incarnation).
    Kafka never takes committed records back (unclean leader election aside), so the read came
    from a stale leader: a broker cut off from the cluster that still serves its old log.
    Restoring to that end would forget outcomes and run their commands again; the owner restarts
    instead, and reads again with fresh metadata."""

    kind = "changelog_behind"

    def __init__(self, topic: str, partition: int, known: int, end: int) -> None:
        super().__init__(f"the end of {topic}[{partition}] read for a restore ({end}) is behind offset "
                         f"{known}, known to be committed: a stale leader; restarting to read again")
        self.topic = topic
        self.partition = partition


class StoreUnwritable(StreamschedError):
    """A partition's local claim store could not be written (disk full, read-only, I/O error).

    The partition stops cleanly (it resolves and commits what it has in hand), then its owner
    fails with this error and restarts with backoff for as long as the fault lasts, each restart
    restoring from the store's checkpoint and the state topic (the changelog), which holds every
    committed claim: nothing is answered from a store that missed a write. ``reason`` is the
    storage engine's one-line message (see :mod:`streamsched.worker.claimstore`)."""

    kind = "store_unwritable"
    outlasts_give_up = True

    def __init__(self, topic: str, partition: int, reason: str) -> None:
        super().__init__(f"claim store of {topic}[{partition}] cannot be written: {reason}")
        self.topic = topic
        self.partition = partition
        self.reason = reason


class RegistryUnavailable(StreamschedError):
    """The schema registry did not answer usefully: unreachable, timing out, refusing our
    credentials or failing. Never the record's fault: a worker's partition waits with backoff
    and then reads the same records again (nothing is dead-lettered for it). ``reason`` is a
    fixed phrase or an HTTP status, never a URL, credential or schema."""

    kind = "registry_unavailable"

    def __init__(self, reason: str) -> None:
        super().__init__(f"schema registry unavailable: {reason}")
        self.reason = reason


class CommandNotAllowed(StreamschedError):
    """A handler used a command its scheduler role does not declare."""

    kind = "command_not_allowed"

    def __init__(self, command: str, scheduler: str) -> None:
        super().__init__(f"command {command!r} is not declared by scheduler {scheduler!r}")
        self.command = command
        self.scheduler = scheduler


class TopicMismatch(StreamschedError):
    """A topic exists with partitions or configs other than its definition; never changed silently."""

    kind = "topic_mismatch"

    def __init__(self, topic: str, field: str, expected: str, actual: str) -> None:
        super().__init__(f"topic {topic}: {field} is {actual!r}, definition says {expected!r}")
        self.topic = topic
        self.field = field
        self.expected = expected
        self.actual = actual


class InvalidDueItem(StreamschedError):
    """A due-work item has a field of the wrong type or outside its bound; ``field`` names it."""

    kind = "invalid_due_item"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid due item {field}: {reason}")
        self.field = field
        self.reason = reason
