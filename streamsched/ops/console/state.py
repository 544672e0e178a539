"""What every console route shares: the configuration and the running state (templates, the
dead-letter tallies, the sampler), stored in the aiohttp application under :data:`STATE`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web
from jinja2 import Environment

from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.ops.console import security, views
from streamsched.ops.console.sampler import Sampler
from streamsched.ops.console.workers import Worker, workers_of
from streamsched.worker.app import SchedulerDef


@dataclass
class ConsoleConfig:
    bootstrap: clients.Conn
    schedulers: Sequence[SchedulerDef]
    catalogs: Sequence[str] = ()
    allow_actions: bool = False
    tokens: tuple[security.Token, ...] = ()
    host: str = "127.0.0.1"
    port: int = 9480
    sample_interval_s: float = 5.0
    workers: Sequence[str] = ()
    """Status server URLs of the workers (``--worker``): the schedulers page shows what they
    keep in memory (breakers, pause, rate budget)."""
    targets: tuple[Worker, ...] = field(init=False, default=())
    """``workers`` checked, each address once, without credentials."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.schedulers]
        if len(set(names)) != len(names):
            raise ConfigError("two --app apps have a scheduler of the same name")
        if not 0 <= self.port <= 65535:  # else the bind fails later with an OverflowError (exit 4)
            raise ConfigError(f"--port must be in 0..65535 (0: a free one), not {self.port}")
        if self.allow_actions and not self.tokens:
            raise ConfigError(f"--allow-actions needs a token (--token-file or {security.TOKEN_ENV})")
        self.targets = workers_of(self.workers)


@dataclass
class State:
    config: ConsoleConfig
    env: Environment
    tallies: dict[str, views.DeadLetterTally]
    sampler: Sampler
    stop: asyncio.Event = field(default_factory=asyncio.Event)


STATE = web.AppKey("state", State)
