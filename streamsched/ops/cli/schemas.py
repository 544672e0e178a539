"""``streamsched schemas register|check``: our transition schema in a schema registry.

A topic in the ``registry`` wire format carries the registry's schema id in every record, so the
transition schema must be registered under the topic's subject (TopicNameStrategy:
``<topic>-value``) before services produce. ``register`` does that and sets the subject's
compatibility (BACKWARD by default: a new version must read what the previous one wrote, the
rule that keeps every stored transition readable). ``check`` reports, per subject, whether our
schema is registered, whether the latest registered version resolves against ours (so workers
can read what producers of that version write) and whether ours could be registered next.
Workers only read from the registry; these commands need write access to it.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from streamsched.errors import ConfigError
from streamsched.ops.cli.common import connect
from streamsched.ops.cli.grammar import add_connection, add_output, command, family
from streamsched.ops.cli.output import show


def add_schemas(sub: Any) -> None:
    fam = family(sub, "schemas", "register the transition schema in a schema registry, or check it")
    from streamsched.kafka.registry import COMPATIBILITY_LEVELS

    for action, text in (("register", "register the transition schema under each registry-format "
                                      "topic's subject and set its compatibility"),
                         ("check", "show per subject whether the registered schema resolves against "
                                   "ours (exit 1 when one does not)")):
        p = command(fam, action, text, cmd_schemas)
        p.add_argument("--topic", action="append", default=None, metavar="TOPIC",
                       help="a transition topic (repeatable); default: every topic with format = "
                            "\"registry\" in --dir")
        p.add_argument("--dir", default="topics", help="directory of *.toml topic definitions")
        if action == "register":
            p.add_argument("--compatibility", default="BACKWARD", choices=COMPATIBILITY_LEVELS,
                           help="the subject's compatibility level")
        add_output(p, default="json", json_alias=None)
        add_connection(p)


def _topics(args: argparse.Namespace) -> list[str]:
    from streamsched.kafka.admin import load_dir
    from streamsched.model.names import validate_name

    if args.topic:
        return [validate_name(t, "topic") for t in dict.fromkeys(args.topic)]
    found = [s.name for s in load_dir(Path(args.dir)) if s.wire_format == "registry"]
    if not found:
        raise ConfigError(f"no topic in {args.dir} has format = \"registry\": name one with --topic")
    return found


def cmd_schemas(args: argparse.Namespace) -> int:
    from streamsched.kafka.registry import client_for

    conn = connect(args)  # a bad connection file or variable is reported first, as everywhere
    topics = _topics(args)
    client = client_for(conn)

    async def act() -> list[dict[str, Any]]:
        async with client:
            if args.action == "register":
                return [await _register(client, t, args.compatibility) for t in topics]
            return [await _check(client, t) for t in topics]

    rows = asyncio.run(act())
    show(args, rows)
    return 0 if args.action == "register" or all(r["resolves"] is not False for r in rows) else 1


async def _register(client: Any, topic: str, compatibility: str) -> dict[str, Any]:
    from streamsched.wire.registry import subject_for, transition_schema_text

    subject = subject_for(topic)
    schema_id = await client.register(subject, transition_schema_text())
    await client.set_compatibility(subject, compatibility)
    return {"topic": topic, "subject": subject, "schema_id": schema_id, "compatibility": compatibility}


async def _check(client: Any, topic: str) -> dict[str, Any]:
    from streamsched.wire.registry import subject_for, transition_schema_text, writer_schema

    subject, ours = subject_for(topic), transition_schema_text()
    latest = await client.latest(subject)
    row: dict[str, Any] = {"topic": topic, "subject": subject,
                           "registered_id": await client.lookup(subject, ours), "latest_version": None,
                           "latest_id": None, "resolves": None, "reason": None,
                           "ours_compatible": await client.compatible(subject, ours)}
    if latest is not None:
        latest_id, version, text = latest
        problem = writer_schema(latest_id, text).problem
        row.update(latest_version=version, latest_id=latest_id, resolves=problem is None, reason=problem)
    return row
