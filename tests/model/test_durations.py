"""Durations as operators write them (streamsched/model/durations.py): seconds or a number with
a unit, nothing else, and no bounds (those are the setting's own rule)."""

from __future__ import annotations

import pytest

from streamsched.errors import ConfigError
from streamsched.model.durations import parse_duration


def test_durations_in_seconds_minutes_hours_and_days() -> None:
    assert parse_duration("7d") == 7 * 86_400 and parse_duration("36h") == 36 * 3_600
    assert parse_duration("90m") == 5_400 and parse_duration("3600") == 3_600
    assert parse_duration("45s") == 45 and parse_duration(" 1.5 h ") == 5_400


@pytest.mark.parametrize("text", ["seven days", "", "7w", "-1d", "1d2h", "d"])
def test_anything_else_is_a_config_error_naming_the_text(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)


def test_no_bounds_here() -> None:
    assert parse_duration("0") == 0 and parse_duration("400d") == 400 * 86_400
