"""Group-wide rate limits: the policy check and the pacer of one owner's share (pure: no I/O, no
clock reads).

A limit such as ``rate=200`` (calls per second) is the whole group's. Each worker takes the share
of the partitions it owns (``rate x owned / partitions``), re-divided on every rebalance, and
paces its calls with a :class:`Pacer`: the generic cell rate algorithm, which spaces calls
``1 / rate`` apart and lets a caller that fell behind (a rebalance, an idle moment) catch up by
at most ``burst_s`` worth of calls. That keeps every window of a few seconds close to the limit,
where a token bucket with a large burst would let one window take a second's worth at once.
"""

from __future__ import annotations

from streamsched.errors import ConfigError
from streamsched.model.limits import is_real

__all__ = ["BURST_S", "MAX_RATE", "Pacer", "check_rate"]

MAX_RATE = 1_000_000.0
"""Highest rate a limit may name (calls per second)."""
BURST_S = 0.25
"""How far (in seconds of calls) a pacer that fell behind may catch up at once."""
_NS = 1_000_000_000


def check_rate(rate: object, what: str) -> float | None:
    """``rate`` as a float (None: no limit); a :class:`ConfigError` naming ``what`` otherwise."""
    if rate is None:
        return None
    if not is_real(rate) or not 0 < rate <= MAX_RATE:
        raise ConfigError(f"{what} rate must be a positive number of calls per second, "
                          f"at most {MAX_RATE:.0f}")
    return float(rate)


class Pacer:
    """When the next call of one owner may start, at a rate that may change between calls."""

    __slots__ = ("_next_ns", "burst_s")

    def __init__(self, burst_s: float = BURST_S) -> None:
        self.burst_s = burst_s
        self._next_ns: int | None = None

    def reserve(self, now_ns: int, rate: float) -> int:
        """Take the next slot at ``rate`` calls per second: how long (ns) to wait before calling."""
        interval = int(_NS / rate) if rate > 0 else _NS
        earliest = now_ns - int(self.burst_s * _NS)
        slot = now_ns if self._next_ns is None else max(self._next_ns, earliest)
        self._next_ns = slot + interval
        return max(0, slot - now_ns)
