"""The shared scenarios run twice: on a TestApp (no broker) and on the session's real broker."""

from __future__ import annotations

import pytest
from scenario_harness import KafkaRig, Rig, VirtualRig


@pytest.fixture(params=["testapp", pytest.param("kafka", marks=pytest.mark.kafka)])
def rig(request: pytest.FixtureRequest) -> Rig:
    if request.param == "testapp":
        return VirtualRig()
    return KafkaRig(request.getfixturevalue("bootstrap"))
