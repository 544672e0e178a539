"""Validation of user-chosen names: schedules, topics, queues, schedulers, selections.

One grammar for all of them (Kafka's legal topic characters, bounded length) so that a schedule
name can always become part of a topic or transactional id. ``__streamsched`` is reserved for the
framework's internal topics.
"""

from __future__ import annotations

import re

from streamsched.errors import InvalidName, ReservedName
from streamsched.model.limits import MAX_NAME_LENGTH

RESERVED_PREFIX = "__streamsched"
_NAME = re.compile(r"[A-Za-z0-9._-]+")


def validate_name(name: object, kind: str = "topic", *, internal: bool = False) -> str:
    """Return ``name`` if it is a legal ``kind`` name, else raise a typed error.

    ``internal=True`` lets the framework itself use the reserved prefix.
    """
    if not isinstance(name, str):
        raise InvalidName(kind, "must be a string")
    if not name:
        raise InvalidName(kind, "must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(kind, f"longer than {MAX_NAME_LENGTH} characters")
    if name in (".", ".."):
        raise InvalidName(kind, "'.' and '..' are not names")
    if not _NAME.fullmatch(name):
        raise InvalidName(kind, "only ASCII letters, digits, '.', '_' and '-' are allowed")
    if name.startswith(RESERVED_PREFIX) and not internal:
        raise ReservedName(kind)
    return name


def internal_topic(*parts: str) -> str:
    """Name of a framework-owned topic, e.g. ``__streamsched.state.due_runs``."""
    for p in parts:
        validate_name(p, "topic")
    return validate_name(".".join((RESERVED_PREFIX, *parts)), "topic", internal=True)


# --- transactional ids ---------------------------------------------------------------------------

TXN_SEPARATOR = ":"
"""Joins the parts of a transactional id. No name of this grammar contains it, so an id splits
back into its parts in exactly one way: distinct owners never share an id (they would fence each
other), and the PREFIXED ACL of one owner never matches another's ids."""

TXN_ROLES: dict[str, tuple[str, ...]] = {
    "scheduler": ("group", "topic"),  # one fenced producer per partition of a scheduler's topic
    "ticker": ("catalog",),  # one per partition of a schedule catalog's definitions topic
}
"""The parts of each role's transactional ids. A fixed number per role is what keeps prefixes
apart: with a variable count, ``scheduler:a:`` would be a prefix of ``scheduler:a:b:0``."""


def _txn_part(value: object, kind: str) -> str:
    # The character rule only, not MAX_NAME_LENGTH: a default group (``streamsched.<name>``) may
    # be longer than a name, and ids have no length bound that matters here.
    if not isinstance(value, str) or not value or not _NAME.fullmatch(value):
        raise InvalidName(kind, "only ASCII letters, digits, '.', '_' and '-' are allowed "
                                "(it is part of a transactional id)")
    return value


def transactional_prefix(role: str, *parts: str) -> str:
    """The prefix every transactional id of one ``role`` owner starts with, and no other owner's
    does: ``streamsched:scheduler:<group>:<topic>:`` or ``streamsched:ticker:<catalog>:``.

    The ACL of the owner's principal is this prefix, PREFIXED, so it covers partitions added later.
    """
    kinds = TXN_ROLES.get(role)
    if kinds is None:
        raise InvalidName("transactional id role", f"expected one of {', '.join(sorted(TXN_ROLES))}")
    if len(parts) != len(kinds):
        raise InvalidName("transactional id", f"a {role} id has exactly the parts {', '.join(kinds)}")
    checked = [_txn_part(v, k) for v, k in zip(parts, kinds, strict=True)]
    return TXN_SEPARATOR.join(("streamsched", role, *checked, ""))


def member_transactional_id(role: str, *parts: str, member: str) -> str:
    """The transactional id of the one producer a ``role`` owner process writes every partition it
    owns through (see :func:`transactional_prefix`): ``<prefix>w-<member>``, e.g.
    ``streamsched:ticker:nightly:w-ticker-0``. ``member`` is the process's group instance id when
    it has one, so a successor under the same id fences its predecessor's producer; else its
    owner name (unique per process). Under the role's prefix, so its ACL is unchanged."""
    return f"{transactional_prefix(role, *parts)}w-{member}"


def transactional_id(role: str, *parts: str, partition: int) -> str:
    """The transactional id of the fenced producer owning ``partition`` for one ``role`` owner
    (see :func:`transactional_prefix`), e.g. ``streamsched:scheduler:streamsched.x:orders:3``."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidName("transactional id", "the partition is a non-negative integer")
    return f"{transactional_prefix(role, *parts)}{partition}"
