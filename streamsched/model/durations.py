"""Durations as operators write them in flags and environment variables: ``"604800"`` (seconds),
``"90m"``, ``"12h"``, ``"7d"``.

Pure parsing, with no bounds: what a duration may be (an outcome horizon's 1 hour .. 365 days,
say) is the caller's rule, checked where that setting is defined.
"""

from __future__ import annotations

import re

from streamsched.errors import ConfigError

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"604800"``, ``"90m"``, ``"12h"`` or ``"7d"`` (a bare number is seconds)."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ConfigError(f"not a duration: {text!r} (use seconds or a number with s, m, h or d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]
