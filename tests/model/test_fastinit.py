"""fast_init: the same constructor as the dataclass's own, only faster (model/fastinit.py)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import KW_ONLY, dataclass, field

import pytest

from streamsched.model.claims import ClaimState, ClaimStatus, Outcome, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.fastinit import fast_init
from streamsched.worker.app import CommandContext, Emit, Turn
from streamsched.worker.execute import Execution
from streamsched.worker.selection import Item
from streamsched.worker.steps import Claim, Resolved


@dataclass(frozen=True, slots=True)
class Plain:
    a: str
    b: int = 3
    c: tuple[int, ...] = ()
    _: KW_ONLY
    d: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Fast:
    a: str
    b: int = 3
    c: tuple[int, ...] = ()
    _: KW_ONLY
    d: str | None = None


def _params(cls: type) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls.__init__).parameters.values()]


def test_the_signature_and_behaviour_are_the_dataclass_own() -> None:
    assert Fast.__init__ is not Plain.__init__
    assert _params(Fast) == _params(Plain)
    x = Fast("q", d="z")
    assert (x.a, x.b, x.c, x.d) == ("q", 3, (), "z")
    assert x == Fast("q", 3, (), d="z") and hash(x) == hash(Fast("q", d="z"))
    assert dataclasses.replace(x, b=9).b == 9
    assert pickle.loads(pickle.dumps(x)) == x
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.a = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Fast()
    with pytest.raises(TypeError):
        Fast("q", 1, (), "positional")


def test_what_it_cannot_reproduce_keeps_the_generated_init() -> None:
    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    for cls in (Factory, Checked, NoSlots):
        generated = cls.__init__
        assert fast_init(cls).__init__ is generated
    with pytest.raises(ValueError):
        Checked(-1)


@pytest.mark.parametrize("cls", [ClaimState, Outcome, TransitionEvent, CommandContext, Emit, Turn, Item,
                                 Claim, Resolved, Execution])
def test_the_hot_values_use_it(cls: type) -> None:
    assert cls.__init__.__module__ == cls.__module__
    assert "__fast_set0" in cls.__init__.__globals__


def test_a_claim_state_is_built_as_before() -> None:
    out = Outcome(OutcomeKind.SUCCEEDED, 2, 5, events=1, digest=b"d")
    st = ClaimState("id", ClaimStatus.RELEASED, "", 2, 0, ordinal=2, revision=4, outcome=out)
    assert (st.identity, st.status, st.owner, st.fence, st.lease_expires_ns, st.ordinal, st.revision,
            st.outcome) == ("id", ClaimStatus.RELEASED, "", 2, 0, 2, 4, out)
    assert ClaimState("id") == ClaimState("id", ClaimStatus.FREE, "", 0, 0, 0, 0, None)
    assert out.error_kind is None
