"""A partition owner failing with a fault of the machine (a claim store that cannot be written)
restarts with backoff for as long as it lasts, never given up; any other failure is given up
after ``give_up_after`` in a row (tests/kafka/test_owner.py)."""

from __future__ import annotations

from streamsched.errors import StoreUnwritable
from streamsched.kafka.owner import Body, PartitionOwner, RestartPolicy
from tests.kafka.test_owner import World, make, supervise_until


class FullDisk(World):
    def __init__(self) -> None:
        super().__init__()
        self.full = True

    async def restore(self, owner: PartitionOwner[str]) -> Body[str]:
        if self.full and owner.partition == 1:
            self.restores[1] += 1
            raise StoreUnwritable("state.t", 1, "No space left on device")
        return await super().restore(owner)


async def test_a_store_that_cannot_be_written_is_retried_past_give_up_and_recovers() -> None:
    world = FullDisk()
    owners, metrics = make(world, RestartPolicy(initial_s=0.01, max_s=0.02, give_up_after=3))
    await owners.assign([0, 1])
    await supervise_until(owners, lambda: world.restores[1] >= 8, "restarts past give_up_after")
    assert not owners.given_up and not owners.ready
    assert metrics.snapshot()["counters"]["errors{kind=store_unwritable}"] >= 8
    world.full = False
    await supervise_until(owners, lambda: owners.ready, "recovered once the disk has room")
    await owners.close()
