"""Fairness per tenant: at most ``tenant_slots`` in-flight claims of one tenant per partition.

Claims are taken in offset order, so without a cap a tenant whose backlog fills the partition's
queue takes every slot of the window, and another tenant's records behind that backlog wait for
all of it. With ``tenant_slots=n`` (claim-first schedulers) a record of a tenant that already
holds ``n`` claims in the partition (counting those picked in the same batch) does not lead: it
is parked on the delay topic, as an item waiting for another owner's lease is, and comes back
through the due index. The partition's offset moves on over it, so the records behind it (other
tenants') are claimed now.

Each parked record of a tenant is due one expected slot later than the previous one (the
partition's recent time per item, divided by the cap): the tenant's backlog comes back about
as fast as its slots free, so a record is parked about once, not once per sweep. Identities
are unchanged: a record runs exactly once, whenever it leads; records of one identity keep
their order (all of a tenant's records that meet a full cap are parked, in order).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MIN_WAIT_NS", "TenantSlots"]

MIN_WAIT_NS = 50_000_000
"""Shortest spacing of a tenant's parked records (a command that takes no time)."""
MAX_TENANTS = 10_000
"""Tenants whose next slot a partition remembers (the least recently parked are forgotten: their
next record is spaced from now)."""


class TenantSlots:
    """The cap of one partition: who is full, and when a parked record of a tenant is due."""

    __slots__ = ("_next", "cap", "item_ns", "load")

    def __init__(self, cap: int, load: Callable[[str], int], item_ns: Callable[[], int]) -> None:
        self.cap = cap
        self.load = load
        """Claims a tenant holds in the partition's window now."""
        self.item_ns = item_ns
        """How long an item of the partition takes lately (claim to result)."""
        self._next: OrderedDict[str, int] = OrderedDict()

    def full(self, tenant: str, chosen: int) -> bool:
        """Whether ``tenant``, with ``chosen`` more leaders picked in this batch, is at its cap."""
        return self.load(tenant) + chosen >= self.cap

    def due_ns(self, tenant: str, now_ns: int) -> int:
        """When the next parked record of ``tenant`` should come back (wall clock, ns)."""
        step = max(MIN_WAIT_NS, self.item_ns() // self.cap)
        due = max(now_ns, self._next.get(tenant, 0)) + step
        self._next[tenant] = due
        self._next.move_to_end(tenant)
        if len(self._next) > MAX_TENANTS:
            self._next.popitem(last=False)
        return due
