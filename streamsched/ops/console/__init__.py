"""``streamsched console``: a read-mostly web console that reads Kafka directly (and, with
``--worker``, the workers' status servers).

Pages: the overview (lag and per-minute charts from a background sampler), schedulers (group,
members, committed offsets and lag per partition, paused or not; each worker's breakers, pause
and rate budget), schedules (a catalog's list
and a schedule's history), dead letters (counts by kind, newest first) and one identity (as
``inspect``). With ``--allow-actions`` and a token: re-drive an identity, enable or disable a
schedule, replay dead letters, pause or resume a scheduler. Layout: :mod:`.app` (server,
pages), :mod:`.actions`, :mod:`.security`, :mod:`.views` (what pages read), :mod:`.sampler`,
:mod:`.charts` (inline SVG), :mod:`.workers` (the workers' ``/status``), ``templates/``.
"""

from __future__ import annotations

from streamsched.ops.console.app import Console
from streamsched.ops.console.security import load_tokens
from streamsched.ops.console.state import ConsoleConfig

__all__ = ["Console", "ConsoleConfig", "load_tokens"]
