"""The declarative app: schedulers, their selections and the exact commands they may run.

A scheduler *role* is one selection (topic + exact filter) and a closed set of commands. Its
handler receives a :class:`Turn` whose ``commands`` proxy exposes only those commands; anything
else raises :class:`CommandNotAllowed`. Handlers never see a producer, a consumer or the state.

Example::

    app = App("billing")

    @external_command()
    async def charge(ctx: CommandContext, *, invoice: str) -> str:
        return await psp.charge(invoice, idempotency_key=ctx.idempotency_key, fence=ctx.fence)

    @app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge])
    async def charge_due(turn: Turn) -> None:
        await turn.commands.charge(invoice=turn.event.target[0])
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamsched.errors import CommandNotAllowed, ConfigError
from streamsched.kafka.admin import TopicSpec
from streamsched.model.breaker import BreakerPolicy
from streamsched.model.event import TransitionEvent
from streamsched.model.fastinit import fast_init
from streamsched.model.identity import IdentityParts, IdentityResolver, route_key
from streamsched.model.jsonval import json_dumps
from streamsched.model.limits import (
    DEFAULT_IN_FLIGHT,
    MAX_CLAIM_DURATION_S,
    MAX_IN_FLIGHT,
    MAX_SELECTION_WAIT_S,
    MIN_CLAIM_DURATION_S,
    check_range,
)
from streamsched.model.names import internal_topic, transactional_prefix, validate_name
from streamsched.model.ratelimit import check_rate
from streamsched.model.retry import RetryPolicy
from streamsched.wire.registry import WireFormat, check_format
from streamsched.wire.transition import encode_transition


@dataclass(frozen=True, slots=True)
class Selection:
    """A named, exact filter over a transition topic: ``event.type == type`` (``None``: all)."""

    name: str
    type: str | None = None

    def __post_init__(self) -> None:
        validate_name(self.name, "selection")

    def matches(self, event: TransitionEvent) -> bool:
        return self.type is None or event.type == self.type


@fast_init
@dataclass(frozen=True, slots=True)
class CommandContext:
    """The immutable values a command may see. Pass ``idempotency_key`` and ``fence`` on."""

    idempotency_key: str
    fence: int
    attempt: int
    ordinal: int
    scheduled_ns: int
    scheduler: str
    schedule: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Emit:
    """One event a Kafka-native command writes, atomically with its outcome and release."""

    topic: str
    value: bytes
    key: bytes | None = None

    @classmethod
    def json(cls, topic: str, obj: object, *, key: bytes | None = None) -> Emit:
        return cls(topic, json_dumps(obj), key)

    @classmethod
    def transition(cls, topic: str, event: TransitionEvent) -> Emit:
        """A follow-up transition, keyed so its identity stays on one partition."""
        return cls(topic, encode_transition(event), route_key(event.tenant, event.target))


ExternalFn = Callable[..., Awaitable[Any]]
KafkaFn = Callable[..., "list[Emit] | Awaitable[list[Emit]]"]


@dataclass(frozen=True)
class ExternalCommand:
    """A command that calls another system; it must be idempotent on ``ctx.idempotency_key``."""

    name: str
    fn: ExternalFn
    breaker: BreakerPolicy | None = None
    """Opens when this command's calls fail (see :mod:`streamsched.model.breaker`)."""
    rate: float | None = None
    """Calls per second the whole group may make to it (see :mod:`streamsched.model.ratelimit`)."""

    kind = "external"


@dataclass(frozen=True)
class KafkaCommand:
    """A command whose effect is the events it returns, written in the outcome's transaction."""

    name: str
    fn: KafkaFn
    outputs: frozenset[str]

    kind = "kafka"


Command = ExternalCommand | KafkaCommand


def external_command(name: str | None = None, *, breaker: BreakerPolicy | None = None,
                     rate: float | None = None) -> Callable[[ExternalFn], ExternalCommand]:
    """Declare an external command; ``breaker``: stop taking work while its calls fail; ``rate``:
    calls per second the whole group may make to it."""
    if breaker is not None and not isinstance(breaker, BreakerPolicy):
        raise ConfigError("breaker must be a streamsched BreakerPolicy")
    checked = check_rate(rate, "command")

    def wrap(fn: ExternalFn) -> ExternalCommand:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"external command {fn.__name__} must be an async function")
        return ExternalCommand(validate_name(name or fn.__name__, "command"), fn, breaker, checked)

    return wrap


def kafka_command(outputs: Iterable[str], name: str | None = None) -> Callable[[KafkaFn], KafkaCommand]:
    allowed = frozenset(validate_name(t, "topic") for t in outputs)
    if not allowed:
        raise ConfigError("a Kafka-native command needs at least one output topic")

    def wrap(fn: KafkaFn) -> KafkaCommand:
        return KafkaCommand(validate_name(name or fn.__name__, "command"), fn, allowed)

    return wrap


class CallGuard(Protocol):
    """What stands between a handler and an external command's call (the worker's flow
    control: circuit breakers); it may refuse the call by raising."""

    async def call(self, command: str, fn: ExternalFn, ctx: CommandContext, kwargs: dict[str, Any]) -> Any:
        ...


class Commands:
    """The handler's only door to effects: exactly the scheduler's declared commands."""

    __slots__ = ("_allowed", "_ctx", "_emits", "_guard", "_results", "_scheduler")

    def __init__(self, scheduler: str, allowed: dict[str, Command], ctx: CommandContext,
                 guard: CallGuard | None = None) -> None:
        self._scheduler = scheduler
        self._allowed = allowed
        self._ctx = ctx
        self._guard = guard
        self._emits: list[Emit] = []
        self._results: list[object] = []

    @property
    def emitted(self) -> tuple[Emit, ...]:
        """Events the Kafka-native commands of this turn returned (the engine writes them)."""
        return tuple(self._emits)

    @property
    def results(self) -> tuple[object, ...]:
        """Results of the external commands of this turn (digested into the outcome)."""
        return tuple(self._results)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        # Reached only for names that are not one of the scheduler's commands (those are methods
        # of the class :func:`commands_class` builds) or that a Commands attribute shadows.
        command = self._allowed.get(name)
        if command is None:
            raise CommandNotAllowed(name, self._scheduler)
        return functools.partial(_command_method(name, command), self)


def _command_method(name: str, command: Command) -> Callable[..., Awaitable[Any]]:
    """The coroutine function that runs ``command`` for a :class:`Commands` (its first argument)."""
    if isinstance(command, ExternalCommand):
        call = command.fn

        async def external(self: Commands, **kwargs: Any) -> Any:
            guard = self._guard
            if guard is None:
                result = await call(self._ctx, **kwargs)
            else:
                result = await guard.call(name, call, self._ctx, kwargs)
            self._results.append(result)
            return result

        external.__name__ = external.__qualname__ = name
        return external
    fn, outputs = command.fn, command.outputs

    async def kafka(self: Commands, **kwargs: Any) -> None:
        produced = fn(self._ctx, **kwargs)
        emits: list[Emit]
        if type(produced) is list or not inspect.isawaitable(produced):
            emits = produced  # a list (the usual answer) is never awaitable: no inspect call
        else:
            emits = await produced
        for emit in emits:
            if not isinstance(emit, Emit) or emit.topic not in outputs:
                raise CommandNotAllowed(f"{name} -> {getattr(emit, 'topic', '?')}", self._scheduler)
        self._emits.extend(emits)

    kafka.__name__ = kafka.__qualname__ = name
    return kafka


def commands_class(commands: dict[str, Command]) -> type[Commands]:
    """A :class:`Commands` subclass with each of ``commands`` as a method.

    ``turn.commands.name(...)`` then finds a method on the class instead of going through
    ``__getattr__``, which built a closure per call (about 4 % of a Kafka-native worker's CPU,
    py-spy). A command named like an attribute of Commands itself stays reachable
    only as before (it never was: the attribute wins)."""
    methods = {name: _command_method(name, command) for name, command in commands.items()
               if not hasattr(Commands, name)}
    return type("Commands", (Commands,), {"__slots__": (), **methods})


@fast_init
@dataclass(frozen=True, slots=True)
class Turn:
    """What a handler gets for one work item."""

    event: TransitionEvent
    ctx: CommandContext
    commands: Commands


Handler = Callable[[Turn], Awaitable[None]]


@dataclass(frozen=True)
class SchedulerDef:
    """One scheduler role and its tuning; built by :meth:`App.scheduler`.

    ``retry`` is how failed handler attempts are retried (``App.scheduler(..., retry=RetryPolicy(...))``).
    The older spelling ``extra={"retry": policy}`` still works: it is moved into ``retry`` (giving
    both, with different policies, is a :class:`ConfigError`).
    """

    name: str
    topic: str
    selection: Selection
    commands: dict[str, Command]
    handler: Handler
    attempt_kind: str = "run"
    max_in_flight: int = DEFAULT_IN_FLIGHT
    claim_duration_s: float = 30.0
    selection_wait_s: float = 1.0
    group: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    wire_format: WireFormat = "streamsched"
    """How services frame events on ``topic``: ``streamsched`` (our envelope) or ``registry``
    (a schema registry's framing; the worker then needs a registry, see
    :mod:`streamsched.wire.registry`). Internal topics always use our envelope."""
    extra: dict[str, Any] = field(default_factory=dict)
    breaker: BreakerPolicy | None = None
    """Opens when the handler's attempts fail transiently, whichever command failed (see
    :mod:`streamsched.model.breaker`; a command can have its own, ``external_command(breaker=)``)."""
    rate: float | None = None
    """Handler runs per second the whole group may start (see :mod:`streamsched.model.ratelimit`;
    a command can have its own, ``external_command(rate=)``)."""
    tenant_slots: int | None = None
    """At most this many in-flight claims of one tenant per partition (see
    :mod:`streamsched.worker.fairness`); None: no cap. Schedulers with an external command."""

    def __post_init__(self) -> None:
        check_format(self.wire_format, f"scheduler {self.name}")
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise ConfigError("breaker must be a streamsched BreakerPolicy")
        object.__setattr__(self, "rate", check_rate(self.rate, f"scheduler {self.name}"))
        if self.tenant_slots is not None:
            if type(self.tenant_slots) is not int or not 1 <= self.tenant_slots <= MAX_IN_FLIGHT:
                raise ConfigError(f"tenant_slots must be an integer in 1..{MAX_IN_FLIGHT} (a tenant's share "
                                  "of a partition's in-flight claims)")
            if not any(isinstance(c, ExternalCommand) for c in self.commands.values()):
                raise ConfigError("tenant_slots applies to a scheduler with an external command (a "
                                  "Kafka-native one holds no slot while a command runs)")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError("retry must be a streamsched RetryPolicy")
        legacy = self.extra.get("retry")
        if legacy is not None:
            if not isinstance(legacy, RetryPolicy):
                raise ConfigError('extra["retry"] must be a streamsched RetryPolicy')
            if self.retry not in (RetryPolicy(), legacy):
                raise ConfigError('retry given twice (retry= and extra["retry"]) with different policies')
            object.__setattr__(self, "retry", legacy)
        validate_name(self.name, "scheduler")
        validate_name(self.topic, "topic")
        validate_name(self.attempt_kind, "attempt kind")
        check_range("max_in_flight", self.max_in_flight, 1, MAX_IN_FLIGHT)
        check_range("claim_duration_s", self.claim_duration_s, MIN_CLAIM_DURATION_S, MAX_CLAIM_DURATION_S)
        check_range("selection_wait_s", self.selection_wait_s, 0.01, MAX_SELECTION_WAIT_S)
        if not self.group:
            object.__setattr__(self, "group", f"streamsched.{self.name}")
        # A group the transactional ids cannot carry is refused here, not in the restart loop.
        transactional_prefix("scheduler", self.group, self.topic)

    @property
    def state_topic(self) -> str:
        return internal_topic("state", self.name)

    @property
    def delay_topic(self) -> str:
        """Where retries with long backoffs wait (co-partitioned; see streamsched.duework)."""
        return internal_topic("delay", self.name)

    @property
    def dead_letter_topic(self) -> str:
        return internal_topic("dlq", self.name)

    @property
    def audit_topic(self) -> str:
        """What owners did with operators' re-drive requests (co-partitioned, keyed by identity)."""
        return internal_topic("audit", self.name)

    @property
    def control_topic(self) -> str:
        """Operators' pause and resume requests (one partition; see :mod:`streamsched.wire.pause`)."""
        return internal_topic("control", self.name)

    def internal_topics(self, partitions: int, replication: int | None) -> list[TopicSpec]:
        """The topics the scheduler owns, co-partitioned with its transition topic (but the
        control topic: one partition that every worker reads whole)."""
        return [TopicSpec(self.state_topic, partitions, replication, kind="state"),
                TopicSpec(self.dead_letter_topic, partitions, replication, kind="dead_letter"),
                TopicSpec(self.delay_topic, partitions, replication, kind="delay"),
                TopicSpec(self.audit_topic, partitions, replication, kind="audit"),
                TopicSpec(self.control_topic, 1, replication, kind="control")]

    @property
    def outputs(self) -> frozenset[str]:
        out: set[str] = set()
        for c in self.commands.values():
            if isinstance(c, KafkaCommand):
                out |= c.outputs
        return frozenset(out)

    @functools.cached_property
    def commands_type(self) -> type[Commands]:
        """What a turn's ``commands`` is built from (:func:`commands_class`), made once."""
        return commands_class(self.commands)

    @functools.cached_property
    def resolve_identity(self) -> IdentityResolver:
        """The business identity of an event under this scheduler (see :mod:`streamsched.model.identity`)."""
        return IdentityResolver(self.name, self.topic, self.selection.name, self.attempt_kind)

    def identity_parts(self, event: TransitionEvent) -> IdentityParts:
        return IdentityParts(scheduler=self.name, topic=self.topic, selection=self.selection.name,
                             due_ns=event.due_ns, tenant=event.tenant, target=tuple(event.target),
                             attempt_kind=self.attempt_kind)


class App:
    """A set of schedulers run by ``streamsched run --app MODULE:ATTR``."""

    def __init__(self, name: str) -> None:
        self.name = validate_name(name, "app")
        self.schedulers: dict[str, SchedulerDef] = {}

    def select(self, name: str | None = None) -> list[SchedulerDef]:
        """Every scheduler, or only ``name`` (a :class:`ConfigError` if the app has none so
        named): what ``run``, ``acl`` and ``replay`` act on when given ``--scheduler``."""
        if name is None:
            return list(self.schedulers.values())
        if name not in self.schedulers:
            raise ConfigError(f"no scheduler named {name!r} in app {self.name}")
        return [self.schedulers[name]]

    def one(self, name: str | None = None) -> SchedulerDef:
        """The scheduler ``name``; without one, the app's only scheduler (else ConfigError)."""
        if name is None and len(self.schedulers) != 1:
            raise ConfigError(f"app {self.name} has {len(self.schedulers)} schedulers: "
                              "name one with --scheduler")
        return self.select(name)[0]

    def scheduler(self, *, topic: str, selection: Selection, commands: Iterable[Command],
                  name: str | None = None, **options: Any) -> Callable[[Handler], Handler]:
        """Declare a scheduler; the decorated async function is its handler.

        ``options`` are the tuning fields of :class:`SchedulerDef` (``retry``, ``max_in_flight``,
        ``claim_duration_s``, ...).
        """

        def wrap(handler: Handler) -> Handler:
            if not inspect.iscoroutinefunction(handler):
                raise ConfigError(f"scheduler handler {handler.__name__} must be async")
            declared: dict[str, Command] = {}
            for c in commands:
                if c.name in declared:
                    raise ConfigError(f"command {c.name} declared twice")
                declared[c.name] = c
            sched = SchedulerDef(name=name or handler.__name__, topic=topic, selection=selection,
                                 commands=declared, handler=handler, **options)
            if sched.name in self.schedulers:
                raise ConfigError(f"scheduler {sched.name} declared twice")
            self.schedulers[sched.name] = sched
            return handler

        return wrap
