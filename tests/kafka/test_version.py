"""Naming a broker's Kafka release from its ApiVersions, and refusing an untested one (issue 8.5).

The maps below are the ApiVersions answers (api key -> (min, max)) measured on this project's
own local broker (``streamsched broker start``) of each release, read through aiokafka 0.14.
"""

from __future__ import annotations

import argparse

import pytest

from streamsched.errors import BrokerError, StreamschedError
from streamsched.kafka import version
from streamsched.kafka.version import UntestedKafkaVersion, check, detect
from streamsched.ops.config import add_connection_options, resolve_connection

KAFKA_3_9_1 = {
    0: (0, 11), 1: (0, 17), 2: (0, 9), 3: (0, 12), 8: (0, 9), 9: (0, 9), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5), 17: (0, 1), 18: (0, 4), 19: (0, 7),
    20: (0, 6), 21: (0, 2), 22: (0, 5), 23: (0, 4), 24: (0, 5), 25: (0, 4), 26: (0, 4), 27: (0, 1),
    28: (0, 4), 29: (0, 3), 30: (0, 3), 31: (0, 3), 32: (0, 4), 33: (0, 2), 34: (0, 2), 35: (0, 4),
    36: (0, 2), 37: (0, 3), 38: (0, 3), 39: (0, 2), 40: (0, 2), 41: (0, 3), 42: (0, 2), 43: (0, 2),
    44: (0, 1), 45: (0, 0), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2), 57: (0, 1), 60: (0, 1), 61: (0, 0), 64: (0, 0), 65: (0, 0), 66: (0, 1), 68: (0, 0),
    69: (0, 0), 74: (0, 0), 75: (0, 0), 80: (0, 0), 81: (0, 0),
}
KAFKA_4_1_1 = {
    0: (0, 13), 1: (4, 18), 2: (1, 10), 3: (0, 13), 8: (2, 9), 9: (1, 9), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 4), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 1),
    28: (0, 5), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (1, 2), 35: (1, 4),
    36: (0, 2), 37: (0, 3), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3), 42: (0, 2), 43: (0, 2),
    44: (0, 1), 45: (0, 1), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2), 57: (0, 2), 60: (0, 2), 61: (0, 0), 64: (0, 0), 65: (0, 0), 66: (0, 2), 68: (0, 1),
    69: (0, 1), 74: (0, 1), 75: (0, 0), 76: (1, 1), 77: (1, 1), 78: (1, 1), 79: (1, 1), 80: (0, 0),
    81: (0, 0), 83: (0, 0), 84: (0, 0), 85: (0, 0), 86: (0, 0), 87: (0, 0), 90: (0, 0), 91: (0, 0),
    92: (0, 0),
}
KAFKA_4_4_0 = {
    0: (0, 13), 1: (4, 18), 2: (1, 11), 3: (0, 13), 8: (2, 10), 9: (1, 10), 10: (0, 6), 11: (0, 9),
    12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6), 16: (0, 5), 17: (0, 1), 18: (0, 5), 19: (2, 7),
    20: (1, 6), 21: (0, 2), 22: (0, 5), 23: (2, 4), 24: (0, 5), 25: (0, 4), 26: (0, 5), 27: (1, 2),
    28: (0, 6), 29: (1, 3), 30: (1, 3), 31: (1, 3), 32: (1, 4), 33: (0, 2), 34: (1, 2), 35: (1, 5),
    36: (0, 2), 37: (0, 3), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3), 42: (0, 3), 43: (0, 2),
    44: (0, 1), 45: (0, 1), 46: (0, 0), 47: (0, 0), 48: (0, 1), 49: (0, 1), 50: (0, 0), 51: (0, 0),
    55: (0, 2), 57: (0, 2), 60: (0, 2), 61: (0, 0), 64: (0, 0), 65: (0, 0), 66: (0, 2), 68: (0, 1),
    69: (0, 1), 74: (0, 1), 75: (0, 0), 76: (1, 1), 77: (1, 1), 78: (1, 2), 79: (1, 2), 80: (0, 1),
    81: (0, 0), 83: (0, 0), 84: (0, 0), 85: (0, 1), 86: (0, 0), 87: (0, 1), 88: (0, 1), 89: (0, 1),
    90: (0, 1), 91: (0, 0), 92: (0, 0), 93: (0, 0), 94: (0, 0),
}


def shifted(base: dict[int, tuple[int, int]], **bumps: int) -> dict[int, tuple[int, int]]:
    """``base`` with the top version of API ``k<key>`` moved by ``bumps['k<key>']``."""
    out = dict(base)
    for name, by in bumps.items():
        key = int(name[1:])
        out[key] = (out[key][0], out[key][1] + by)
    return out


def test_measured_releases_are_named_and_only_tested_lines_pass() -> None:
    assert detect(KAFKA_3_9_1).line == "3.9" and detect(KAFKA_3_9_1).tested
    assert detect(KAFKA_4_4_0).line == "4.4" and detect(KAFKA_4_4_0).tested
    assert detect(KAFKA_4_1_1).line == "4.1" and not detect(KAFKA_4_1_1).tested
    assert version.TESTED_LINES == ("3.9", "4.4")


def test_unknown_releases_are_placed_between_the_known_ones() -> None:
    between = detect(shifted(KAFKA_4_1_1, k2=1, k18=1))  # a 4.2/4.3-like broker
    assert (between.line, between.name) == (None, "Kafka 4.x between 4.1 and 4.4")
    newer = detect(shifted(KAFKA_4_4_0, k1=1))  # a release after 4.4 (a new Fetch version)
    assert (newer.line, newer.name) == (None, "Kafka 4.x newer than 4.4")
    older = detect(shifted(KAFKA_3_9_1, k1=-1, k3=-1))
    assert (older.line, older.name) == (None, "Kafka 3.x older than 3.9")
    # 4.0 removed Fetch v0-3 (KIP-896): a 3.9 map with a 4.x Fetch floor is no 3.9.
    assert detect({**KAFKA_3_9_1, 1: (4, 17)}).line is None
    assert detect({0: (0, 11)}).name == "Kafka 3.x or older (it lacks core APIs)"


def test_an_untested_release_is_a_one_line_typed_error_unless_allowed() -> None:
    with pytest.raises(UntestedKafkaVersion) as err:
        check("k:9092", KAFKA_4_1_1, allow_untested=False)
    assert isinstance(err.value, BrokerError) and isinstance(err.value, StreamschedError)
    assert str(err.value) == (
        "Kafka at k:9092 is Kafka 4.1, not a tested release (tested: 3.9.x, 4.4.x); pass "
        "--allow-untested-kafka or set STREAMSCHED_ALLOW_UNTESTED_KAFKA=1 to connect anyway")
    assert check("k:9092", KAFKA_4_1_1, allow_untested=True).line == "4.1"
    assert check("k:9092", KAFKA_3_9_1, allow_untested=False).tested


def test_the_override_comes_from_flag_variable_or_connection_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_connection_options(parser)
    flag = resolve_connection(parser.parse_args(["--bootstrap", "k:1", "--allow-untested-kafka"]), env={})
    assert flag.allow_untested_kafka and flag.describe()["allow_untested_kafka"] is True
    none = resolve_connection(parser.parse_args(["--bootstrap", "k:1"]), env={})
    assert not none.allow_untested_kafka
    env = resolve_connection(parser.parse_args(["--bootstrap", "k:1"]),
                             env={"STREAMSCHED_ALLOW_UNTESTED_KAFKA": "1"})
    assert env.allow_untested_kafka
    conf = tmp_path / "c.toml"
    conf.write_text('bootstrap = "k:1"\nallow_untested_kafka = true\n')
    assert resolve_connection(parser.parse_args(["--config", str(conf)]), env={}).allow_untested_kafka
    # The flag's negative form beats the variable.
    off = resolve_connection(parser.parse_args(["--bootstrap", "k:1", "--no-allow-untested-kafka"]),
                             env={"STREAMSCHED_ALLOW_UNTESTED_KAFKA": "1"})
    assert not off.allow_untested_kafka
    assert version.allowed_by_env({"STREAMSCHED_ALLOW_UNTESTED_KAFKA": "yes"})
    assert not version.allowed_by_env({})
