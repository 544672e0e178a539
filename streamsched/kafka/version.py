"""Which Apache Kafka release a broker runs, read from its ApiVersions, and whether it is tested.

Every client the project builds checks the cluster once per process and bootstrap list when it
starts (:func:`streamsched.kafka.clients.verify_broker`): a broker whose release is not one the
compat tests and crash matrix ran on is refused with :class:`UntestedKafkaVersion`, unless the
connection allows it (``--allow-untested-kafka``, ``STREAMSCHED_ALLOW_UNTESTED_KAFKA=1`` or
``allow_untested_kafka = true`` in the connection file).

A broker does not tell its release to an aiokafka 0.14 client (ApiVersions v2 carries no
features), but every minor release changes the versions of some core APIs, and Kafka 4.0
removed Fetch v0-3 (KIP-896). So a release is named by :data:`FINGERPRINTS`: the highest
version of a few core APIs, measured on each release's own broker (3.9.1, 4.1.1 and 4.4.0 with
``streamsched broker start``). Patch releases do not change API versions, so a *line* (3.9,
4.4) is what is tested; a broker matching no fingerprint is named by where it falls between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from streamsched import settings
from streamsched.errors import BrokerError

TESTED_KAFKA_VERSIONS: Final = ("3.9.1", "4.4.0")
"""Releases the broker-compat tests and the crash matrix pass on, oldest first (``make test``
runs both); the local broker defaults to the newest."""
TESTED_LINES: Final = tuple(".".join(v.split(".")[:2]) for v in TESTED_KAFKA_VERSIONS)
ALLOW_ENV: Final = "STREAMSCHED_ALLOW_UNTESTED_KAFKA"

FETCH = 1
MARKER_KEYS: Final = (0, 1, 2, 3, 8, 9, 18, 26, 28, 35, 42)
"""Produce, Fetch, ListOffsets, Metadata, OffsetCommit, OffsetFetch, ApiVersions, EndTxn,
TxnOffsetCommit, DescribeLogDirs, DeleteGroups: APIs every broker listener answers whatever its
configuration, whose top versions moved between the releases below."""
FINGERPRINTS: Final[Mapping[str, Mapping[int, int]]] = {
    "3.9": {0: 11, 1: 17, 2: 9, 3: 12, 8: 9, 9: 9, 18: 4, 26: 4, 28: 4, 35: 4, 42: 2},
    "4.1": {0: 13, 1: 18, 2: 10, 3: 13, 8: 9, 9: 9, 18: 4, 26: 5, 28: 5, 35: 4, 42: 2},
    "4.4": {0: 13, 1: 18, 2: 11, 3: 13, 8: 10, 9: 10, 18: 5, 26: 5, 28: 6, 35: 5, 42: 3},
}
"""Top version of each :data:`MARKER_KEYS` API per release line (measured), oldest first."""


class UntestedKafkaVersion(BrokerError):
    """The cluster runs a Kafka release streamsched was not tested with."""

    def __init__(self, bootstrap: str, detected: DetectedVersion) -> None:
        self.bootstrap = bootstrap
        self.detected = detected
        super().__init__(
            f"Kafka at {bootstrap} is {detected.name}, not a tested release (tested: "
            f"{tested_range()}); pass --allow-untested-kafka or set {ALLOW_ENV}=1 to connect anyway")


@dataclass(frozen=True)
class DetectedVersion:
    """What a broker's ApiVersions say about its release."""

    line: str | None
    """The release line (``"4.4"``) when the API versions match one exactly, else None."""
    name: str
    """Human text: ``Kafka 4.4`` or e.g. ``Kafka 4.x between 4.1 and 4.4``."""

    @property
    def tested(self) -> bool:
        return self.line in TESTED_LINES


def tested_range() -> str:
    """``3.9.x, 4.4.x``: the tested lines as an error names them."""
    return ", ".join(f"{line}.x" for line in TESTED_LINES)


def detect(versions: Mapping[int, tuple[int, int]]) -> DetectedVersion:
    """The release a broker's ApiVersions (api key -> (min, max)) identify."""
    tops = {k: versions[k][1] for k in MARKER_KEYS if k in versions}
    fetch_min = versions.get(FETCH, (0, 0))[0]
    major = "4.x or newer" if fetch_min >= 4 else "3.x or older"  # KIP-896 removed Fetch v0-3 in 4.0
    if len(tops) < len(MARKER_KEYS):
        return DetectedVersion(None, f"Kafka {major} (it lacks core APIs)")
    for line, fp in FINGERPRINTS.items():
        if tops == dict(fp) and (fetch_min >= 4) == (int(line.split(".")[0]) >= 4):
            return DetectedVersion(line, f"Kafka {line}")
    lines = list(FINGERPRINTS)
    below = [line for line in lines if all(tops[k] >= FINGERPRINTS[line][k] for k in MARKER_KEYS)]
    above = [line for line in lines if all(tops[k] <= FINGERPRINTS[line][k] for k in MARKER_KEYS)]
    family = "4.x" if fetch_min >= 4 else "3.x"
    if below and above:
        where = f"between {below[-1]} and {above[0]}"
    elif below:
        where = f"newer than {below[-1]}"
    elif above:
        where = f"older than {above[0]}"
    else:
        where = "unlike any known release"
    return DetectedVersion(None, f"Kafka {family} {where}")


def allowed_by_env(env: Mapping[str, str] | None = None) -> bool:
    """``STREAMSCHED_ALLOW_UNTESTED_KAFKA`` is set to a true value."""
    return settings.value(ALLOW_ENV, env) is True  # a bad spelling is a ConfigError, not "no"


def check(bootstrap: str, versions: Mapping[int, tuple[int, int]], *,
          allow_untested: bool) -> DetectedVersion:
    """The broker's release; raises :class:`UntestedKafkaVersion` for an untested one unless
    allowed."""
    detected = detect(versions)
    refuse_untested(bootstrap, detected, allow_untested=allow_untested)
    return detected


def refuse_untested(bootstrap: str, detected: DetectedVersion, *, allow_untested: bool) -> None:
    """Raise :class:`UntestedKafkaVersion` for an untested release unless allowed."""
    if not detected.tested and not allow_untested:
        raise UntestedKafkaVersion(bootstrap, detected)
