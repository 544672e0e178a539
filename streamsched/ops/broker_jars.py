"""Kafka releases for the local runner: which one to run, its jars (resolved by Maven into a cache
directory, one per version) and its logging configuration (log4j 1 for 3.x, log4j2 for 4.x).

Split from :mod:`streamsched.ops.broker` (which re-exports these names): this is what changes
with a Kafka release; the runner itself does not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from streamsched.errors import BrokerError, StreamschedError
from streamsched.kafka.version import TESTED_KAFKA_VERSIONS as TESTED_KAFKA_VERSIONS

KAFKA_VERSION = TESTED_KAFKA_VERSIONS[-1]
"""The default broker version: the newest tested one (``STREAMSCHED_KAFKA_VERSION`` overrides)."""
VERSION_ENV = "STREAMSCHED_KAFKA_VERSION"

DEFAULT_HEAP = "-Xmx512m"

_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")


def kafka_version(version: str | None = None) -> str:
    """The broker version to run: ``version``, else ``$STREAMSCHED_KAFKA_VERSION``, else the default.

    Any released version may be run (that is how a new one is tried); commands connecting to it
    refuse it unless it is tested or allowed (:mod:`streamsched.kafka.version`).
    """
    chosen = (version or os.environ.get(VERSION_ENV) or KAFKA_VERSION).strip()
    if not _VERSION_RE.fullmatch(chosen):
        raise BrokerError(f"not a Kafka version: {chosen!r} (expected e.g. {KAFKA_VERSION})")
    if int(chosen.split(".")[0]) < 3:
        raise BrokerError(f"Kafka {chosen} cannot run KRaft combined nodes; tested: "
                          f"{', '.join(TESTED_KAFKA_VERSIONS)}")
    return chosen


def is_kafka4(version: str) -> bool:
    """Kafka 4 logs through log4j2 (3.x: log4j 1 via reload4j)."""
    return int(version.split(".")[0]) >= 4


def cache_root() -> Path:
    """streamsched's cache: ``$STREAMSCHED_CACHE``, else ``streamsched`` under ``$XDG_CACHE_HOME``
    or ~/.cache (Kafka's jars, the test registry, the examples' builds)."""
    root = os.environ.get("STREAMSCHED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "streamsched"
    )
    return Path(root)


def cache_dir(version: str | None = None) -> Path:
    """Where the jars of one Kafka version are cached (one directory per version)."""
    return cache_root() / f"kafka-{kafka_version(version)}"


_RELOAD4J = re.compile(r"\s*<dependency>\s*<groupId>org\.slf4j</groupId>\s*"
                       r"<artifactId>slf4j-reload4j</artifactId>.*?</dependency>", re.S)
_LOG4J2_BINDING = """
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>2.24.3</version>
      <exclusions>
        <exclusion><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId></exclusion>
        <exclusion><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId></exclusion>
      </exclusions>
    </dependency>"""


def pom_for(version: str) -> str:
    """The pinned pom for ``version``: Kafka 4 brings log4j2 and drops reload4j, so its slf4j 1.7
    binding is log4j2's (with Kafka's own log4j-api/core; without a binding the broker logs
    nothing at all)."""
    pom = resources.files("streamsched._kafka").joinpath("pom.xml").read_text()
    pom = pom.replace("@KAFKA_VERSION@", version)
    if is_kafka4(version):
        pom, n = _RELOAD4J.subn(_LOG4J2_BINDING, pom)
        if n != 1:
            raise BrokerError("streamsched/_kafka/pom.xml no longer names slf4j-reload4j")
    return pom


def java() -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on PATH (Java 17 runs Kafka and its tools)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("java is not on PATH (Java 17 is required to run the local broker)")
    return found


def ensure_jars(version: str | None = None, *, quiet: bool = True) -> Path:
    """Resolve the broker's runtime classpath of ``version`` with Maven once; later calls hit the cache."""
    version = kafka_version(version)
    target = cache_dir(version)
    lib = target / "lib"
    marker = target / "resolved.ok"
    if marker.exists() and any(lib.glob("kafka_2.13-*.jar")) and any(lib.glob("kafka-tools-[0-9]*.jar")):
        return lib
    target.mkdir(parents=True, exist_ok=True)
    (target / "pom.xml").write_text(pom_for(version))
    run_mvn(["dependency:copy-dependencies", f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
            cwd=target, what=f"Kafka {version}'s jars", quiet=quiet)
    marker.write_text(version + "\n")
    return lib


def run_mvn(args: list[str], *, cwd: Path, what: str, quiet: bool = True,
            error: type[StreamschedError] = BrokerError, log: Path | None = None) -> None:
    """Run ``mvn -B`` with ``args`` in ``cwd``; ``error`` (naming ``what``) when mvn is missing or fails.

    A failure is one line, Maven's own reason (:func:`mvn_reason`); all of its output goes to
    ``log`` (default ``cwd/mvn.log``), which the line names."""
    if shutil.which("mvn") is None:
        raise error(f"mvn is not on PATH; it is needed once to fetch {what}")
    proc = subprocess.run(["mvn", "-B", "-q" if quiet else "-e", *args], cwd=cwd, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        log = log or cwd / "mvn.log"
        output = proc.stdout + proc.stderr
        try:
            log.write_text(output)
            where = f" (Maven's output: {log})"
        except OSError:
            where = ""
        raise error(f"mvn could not resolve {what}: {mvn_reason(output, proc.returncode)}{where}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HELP_LINK = re.compile(r"\s*-> \[Help \d+\]$")
_ARTIFACT_REASON = re.compile(r"Could not (?:find|transfer) artifact .*")


def mvn_reason(output: str, returncode: int) -> str:
    """Maven's reason for a failure in one line: its first ``[ERROR]`` line without colour codes
    or help link, narrowed to the artifact it could not find or download when it names one (the
    rest of that line repeats the project and every artifact; a new user needs the first)."""
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    first = next((e for e in errors if e), None) or next((ln for ln in reversed(lines) if ln), None)
    if first is None:
        return f"exit code {returncode}, no output"
    first = _HELP_LINK.sub("", first)
    artifact = _ARTIFACT_REASON.search(first)
    return artifact.group(0) if artifact else first


_LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File=${kafka.logs.dir}/server.log
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log=WARN
"""

_LOG4J2 = """\
# Kafka 4 logs through log4j2: the same file, rotation and quiet loggers as _LOG4J.
status = warn
name = streamsched-broker
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.storage.name = org.apache.kafka.storage.internals.log
logger.storage.level = WARN
logger.log.name = kafka.log
logger.log.level = WARN
"""


def logging_config(version: str) -> tuple[str, str, str]:
    """(file name, its text, the JVM option that points at it) for ``version``'s logging."""
    if is_kafka4(version):
        return "log4j2.properties", _LOG4J2, "-Dlog4j2.configurationFile=file:{path}"
    return "log4j.properties", _LOG4J, "-Dlog4j.configuration=file:{path}"
