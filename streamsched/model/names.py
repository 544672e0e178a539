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
