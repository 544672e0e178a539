"""MirrorMaker 2 for disaster recovery: mirror a scheduler's topics from a primary cluster to a
secondary one, names unchanged, and run it as a local process.

What a failover needs from the mirror, and the setting that gives it (:meth:`MirrorPlan.properties`):

* **names unchanged**, so workers started against the secondary find their topics:
  :data:`POLICY_CLASS`, Kafka's identity replication with one change. Every stock policy treats a
  topic named ``__*`` as Kafka-internal and never mirrors it, and every streamsched-owned topic
  (state, delay, dead letters, audit, control) is named ``__streamsched.*``. The class is
  compiled once from ``streamsched/_kafka/StreamschedReplicationPolicy.java`` into the cache
  (the stock topic filter's exclusions, ``__.*`` among them, are lifted: ``topics.exclude``;
  the list of topics is exact names anyway);
* **committed records only**: the primary's consumer reads ``read_committed`` (the default
  mirrors an aborted claim as an ordinary record, compacted state topics included);
* **the groups' positions**: checkpoints and ``sync.group.offsets.enabled``, every second, with
  the offset syncs kept on the secondary (readable after the primary is gone);
* **prompt discovery**: topics and groups are looked for every 5 s (the default is 10 minutes);
* only primary → secondary: the reverse flow and its heartbeats are off, and ACLs are not synced
  (each cluster's roles are applied there: see docs/disaster-recovery.md).

Jars: Kafka's ``connect-mirror`` of :data:`MIRROR_VERSION` (the 4.x line Maven Central serves),
resolved by Maven into the same cache as the broker's (:mod:`streamsched.ops.broker_jars`).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO

from streamsched.errors import BrokerError, ConfigError
from streamsched.kafka.clients import Connection
from streamsched.ops.broker import pid_file_alive
from streamsched.ops.broker_jars import cache_root, java, logging_config, run_mvn
from streamsched.ops.broker_security import private_file

MIRROR_VERSION = "4.2.0"
OWN_PREFIX = "__streamsched."
"""streamsched's own topics: mirrored although named ``__*`` (the replication policy's exception)."""
POLICY_CLASS = "dev.streamsched.mirror.StreamschedReplicationPolicy"
SOURCE_ALIAS = "primary"
TARGET_ALIAS = "secondary"
DEFAULT_HEAP = "-Xmx384m"
_PR_SET_PDEATHSIG = 1
_ALIAS = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def ensure_mirror_jars(version: str = MIRROR_VERSION, *, quiet: bool = True) -> list[Path]:
    """MirrorMaker's classpath (its jars, and the compiled replication policy), resolved once."""
    target = cache_root() / f"connect-mirror-{version}"
    lib, classes, marker = target / "lib", target / "classes", target / "resolved.ok"
    if marker.exists() and any(lib.glob("connect-mirror-[0-9]*.jar")):
        return [lib, classes]
    target.mkdir(parents=True, exist_ok=True)
    pom = resources.files("streamsched._kafka").joinpath("mirror-pom.xml").read_text()
    (target / "pom.xml").write_text(pom.replace("@MIRROR_VERSION@", version))
    run_mvn(["dependency:copy-dependencies", f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
            cwd=target, what=f"MirrorMaker {version}'s jars", quiet=quiet)
    source = target / "StreamschedReplicationPolicy.java"
    source.write_text(resources.files("streamsched._kafka").joinpath(source.name).read_text())
    javac = Path(java()).with_name("javac")
    proc = subprocess.run([str(javac), "-cp", f"{lib}/*", "-d", str(classes), str(source)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()[:1]
        raise BrokerError(f"javac could not compile {source.name}: {first[0] if first else proc.returncode}")
    marker.write_text(version + "\n")
    return [lib, classes]


def check_alias(alias: str) -> str:
    """``alias`` if it can name a cluster in MirrorMaker's configuration and topic names."""
    if not _ALIAS.fullmatch(alias):
        raise ConfigError(f"not a cluster alias: {alias!r} (a letter, then up to 31 letters, digits, _)")
    return alias


def checkpoints_topic(source_alias: str) -> str:
    """Where MirrorMaker writes the translated group offsets of ``source_alias``'s groups (on the target)."""
    return f"{check_alias(source_alias)}.checkpoints.internal"


def java_client_properties(conn: Connection) -> dict[str, str]:
    """The Java client settings that reach the cluster ``conn`` reaches (TLS with PEM files,
    SASL PLAIN or SCRAM); a token provider (OAUTHBEARER) is Python and cannot be handed over."""
    props = {"bootstrap.servers": conn.bootstrap, "security.protocol": conn.security_protocol}
    if conn.uses_sasl:
        module = {"PLAIN": _PLAIN_MODULE, "SCRAM-SHA-256": _SCRAM_MODULE,
                  "SCRAM-SHA-512": _SCRAM_MODULE}.get(conn.sasl_mechanism or "")
        if module is None or conn.sasl_password is None:
            raise ConfigError(f"MirrorMaker cannot authenticate with {conn.sasl_mechanism}: give it a "
                              f"connection with SASL PLAIN or SCRAM")
        password = conn.sasl_password.reveal()
        props["sasl.mechanism"] = str(conn.sasl_mechanism)
        props["sasl.jaas.config"] = (f'{module} required username="{_quoted(conn.sasl_username or "")}" '
                                     f'password="{_quoted(password)}";')
    if conn.uses_tls:
        if conn.ssl_cafile:
            props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": conn.ssl_cafile}
        if conn.ssl_certfile:
            props |= {"ssl.keystore.type": "PEM",
                      "ssl.keystore.certificate.chain": Path(conn.ssl_certfile).read_text(),
                      "ssl.keystore.key": Path(conn.ssl_keyfile or conn.ssl_certfile).read_text()}
            if conn.ssl_key_password is not None:
                props["ssl.key.password"] = conn.ssl_key_password.reveal()
        if not conn.ssl_check_hostname:
            props["ssl.endpoint.identification.algorithm"] = ""
    return props


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def exact_patterns(names: list[str] | tuple[str, ...]) -> str:
    """MirrorMaker's topic or group list matching exactly ``names`` (each a regex)."""
    return ", ".join(re.escape(n) for n in sorted(set(names)))


@dataclass(frozen=True)
class MirrorPlan:
    """What to mirror from ``source`` to ``target``: ``topics`` and the ``groups`` whose positions
    follow them (exact names), and the replication factor of MirrorMaker's own topics."""

    source: Connection
    target: Connection
    topics: tuple[str, ...]
    groups: tuple[str, ...] = ()
    replication: int = 3
    source_alias: str = SOURCE_ALIAS
    target_alias: str = TARGET_ALIAS
    tasks: int = 2
    interval_s: int = 1
    options: dict[str, str] = field(default_factory=dict)
    """More MirrorMaker settings, over these (e.g. ``primary.consumer.fetch.max.wait.ms``)."""

    def __post_init__(self) -> None:
        for alias in (self.source_alias, self.target_alias):
            check_alias(alias)
        if self.source_alias == self.target_alias:
            raise ConfigError("the two clusters need different aliases")
        if not self.topics:
            raise ConfigError("nothing to mirror: name the topics (--dir, --app, --catalog)")
        internal = sorted(t for t in self.topics if t.endswith((".internal", "-internal"))
                          or t.startswith(".") or (t.startswith("__") and not t.startswith(OWN_PREFIX)))
        if internal:
            raise ConfigError(f"topic {internal[0]} cannot be mirrored: MirrorMaker takes every topic "
                              f"named *.internal, *-internal, .* or __* (but streamsched's own) for an "
                              f"internal one and never copies it")

    @property
    def flow(self) -> str:
        return f"{self.source_alias}->{self.target_alias}"

    @property
    def checkpoints_topic(self) -> str:
        """Where MirrorMaker writes translated group offsets, on the target."""
        return checkpoints_topic(self.source_alias)

    def properties(self) -> dict[str, str]:
        """The MirrorMaker 2 configuration (the module docs say why each setting is there)."""
        a, b, rf, every = self.source_alias, self.target_alias, str(self.replication), str(self.interval_s)
        props = {"clusters": f"{a}, {b}",
                 f"{self.flow}.enabled": "true",
                 f"{self.flow}.topics": exact_patterns(self.topics),
                 f"{self.flow}.groups": exact_patterns(self.groups) if self.groups else "",
                 f"{b}->{a}.enabled": "false",
                 f"{b}->{a}.emit.heartbeats.enabled": "false",
                 "replication.policy.class": POLICY_CLASS,
                 "topics.exclude": "",
                 "groups.exclude": "",
                 f"{a}.consumer.isolation.level": "read_committed",
                 "sync.topic.acls.enabled": "false",
                 "sync.group.offsets.enabled": "true",
                 "sync.group.offsets.interval.seconds": every,
                 "emit.checkpoints.interval.seconds": every,
                 "emit.heartbeats.interval.seconds": every,
                 "refresh.topics.interval.seconds": "5",
                 "refresh.groups.interval.seconds": "5",
                 "offset-syncs.topic.location": "target",
                 "tasks.max": str(self.tasks),
                 "replication.factor": rf}
        for topic in ("checkpoints.topic", "heartbeats.topic", "offset-syncs.topic", "offset.storage",
                      "status.storage", "config.storage"):
            props[f"{topic}.replication.factor"] = rf
        for alias, conn in ((a, self.source), (b, self.target)):
            props |= {f"{alias}.{k}": v for k, v in java_client_properties(conn).items()}
        bad = sorted(k for k in self.options if _locked(k))
        if bad:
            raise ConfigError(f"MirrorMaker setting {bad[0]} is set by streamsched (what a failover relies "
                              f"on, or the connection's own)")
        return props | self.options


_LOCKED_BASE = frozenset({
    "clusters", "enabled", "topics", "groups", "topics.exclude", "groups.exclude", "topics.blacklist",
    "groups.blacklist", "topic.filter.class", "group.filter.class", "config.properties.exclude",
    "replication.policy.class", "replication.policy.separator", "offset-syncs.topic.location",
    "emit.checkpoints.enabled", "sync.group.offsets.enabled", "sync.topic.acls.enabled",
    "emit.heartbeats.enabled"})
"""Settings a ``--mirror-option`` may not set, plain or under a cluster's or a flow's prefix: what
is mirrored, how names map, whether positions are translated and where the syncs live."""
_LOCKED_ANYWHERE = re.compile(r".*isolation\.level|.*bootstrap\.servers|.*security\.protocol"
                              r"|(.*\.)?(ssl|sasl)\..*")
"""...and what is read, and the clusters' connections (from the connection files)."""
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]*(->[A-Za-z][A-Za-z0-9_]*)?\.")


def _locked(key: str) -> bool:
    if _LOCKED_ANYWHERE.fullmatch(key) or key in _LOCKED_BASE:
        return True
    prefix = _PREFIX.match(key)
    return prefix is not None and key[prefix.end():] in _LOCKED_BASE


def render_properties(props: dict[str, str]) -> str:
    """``props`` as a Java properties file (backslashes doubled, line breaks escaped)."""
    def esc(text: str, *, key: bool = False) -> str:
        out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        # Java reads a properties file as ISO-8859-1: anything past ASCII as \uXXXX escapes.
        out = "".join(c if 0x20 <= ord(c) < 0x7F else _unicode_escape(c) for c in out)
        return re.sub(r"([=: #!])", r"\\\1", out) if key else out
    return "".join(f"{esc(k, key=True)} = {esc(v)}\n" for k, v in props.items())


def _death_signal() -> Callable[[], None] | None:
    """What the child runs before exec so that it gets SIGTERM when this process dies (Linux
    ``PR_SET_PDEATHSIG``; None elsewhere: the pid file is how an operator finds it). ``prctl`` is
    looked up here, in the parent: the child of a threaded process runs no loader code."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def _unicode_escape(char: str) -> str:
    """``char`` as Java's properties escapes (UTF-16 code units: a surrogate pair past U+FFFF)."""
    raw = char.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(raw[i:i + 2], 'big'):04x}" for i in range(0, len(raw), 2))


@dataclass
class MirrorMaker:
    """A MirrorMaker 2 process running ``plan`` (dedicated mode, the target's herder only), its
    configuration (mode 0600: it holds credentials) and logs under ``workdir``."""

    plan: MirrorPlan
    workdir: Path
    heap: str = DEFAULT_HEAP
    version: str = MIRROR_VERSION
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock: IO[str] | None = field(default=None, repr=False)

    def claim_workdir(self) -> None:
        """Hold ``workdir``'s lock for this object's life; :class:`BrokerError` if another holds
        it, or if the MirrorMaker its pid file names is still running (its parent died)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        held = self._lock if self._lock is not None else open(self.workdir / "mirror.lock", "a")  # noqa: SIM115
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.close()
            raise BrokerError(f"a MirrorMaker of {self.workdir} is running already: stop it first, or give "
                              f"another --workdir") from None
        self._lock = held
        pid_file = self.workdir / "mirror.pid"
        if pid_file_alive(pid_file):
            raise BrokerError(f"a MirrorMaker of {self.workdir} is running already (pid "
                              f"{pid_file.read_text().strip()}): stop it first, or give another --workdir")

    def start(self) -> MirrorMaker:
        self.claim_workdir()
        classpath = ensure_mirror_jars(self.version)
        config = private_file(self.workdir / "mm2.properties", render_properties(self.plan.properties()))
        name, text, option = logging_config(self.version)
        (self.workdir / name).write_text(text)
        cmd = [java(), self.heap, "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
               f"-Dkafka.logs.dir={self.workdir}", option.format(path=self.workdir / name),
               "-cp", f"{classpath[0]}/*:{classpath[1]}", "org.apache.kafka.connect.mirror.MirrorMaker",
               str(config), "--clusters", self.plan.target_alias]
        out = open(self.workdir / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            # Its own session (a terminal's Ctrl-C goes to this process, which stops it in order),
            # but it dies with this process: a mirror left running after a failover's "stop the
            # mirror" would go on writing the primary's records into the secondary.
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_death_signal())
        finally:
            out.close()
        # Its pid, for an operator (or a supervisor) that has to stop it without this process.
        (self.workdir / "mirror.pid").write_text(f"{self.proc.pid}\n")
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *, timeout: float = 20.0, sig: int = signal.SIGTERM) -> None:
        """Stop the process (SIGTERM, then SIGKILL past ``timeout``)."""
        if self.proc is None or self.proc.poll() is not None:
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            return
        self.proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        (self.workdir / "mirror.pid").unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()  # releases the workdir
            self._lock = None

    def __enter__(self) -> MirrorMaker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
