"""Fuzzing identity resolution and bound validation: never a crash, always a typed error that
carries no plaintext input (the same path dead-letters a record as kind "bound")."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsched.errors import StreamschedError
from streamsched.model.identity import IdentityParts, IdentityResolver, business_identity, route_key

pytestmark = pytest.mark.fuzz
FUZZ_EXAMPLES = int(os.environ.get("STREAMSCHED_FUZZ_EXAMPLES", "4000"))
"""Examples per run: 4,000 keeps the suite within its time budget; a deeper run sets more."""
MARK = "Zq7SECRET"
RESOLVE = IdentityResolver("fuzz", "fuzz.topic", "due", "run")
anything = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=40),
                     st.text(max_size=40))
texts = st.one_of(st.text(max_size=300), st.text(alphabet=st.characters(categories=["Cs"]), max_size=3))
targets = st.one_of(st.lists(st.one_of(texts, anything), max_size=12).map(tuple),
                    st.lists(st.text(min_size=100, max_size=300), min_size=3, max_size=9).map(tuple),
                    anything)
dues = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), anything)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(due=dues, tenant=st.one_of(texts, anything), target=targets)
def test_identity_resolution_is_total(due: object, tenant: object, target: object) -> None:
    marked = MARK + tenant if isinstance(tenant, str) else tenant
    try:
        ident = RESOLVE(due, marked, target)  # type: ignore[arg-type]
    except StreamschedError as exc:
        assert MARK not in str(exc) and MARK not in repr(exc.args)
        return
    assert ident.startswith("sched_") and len(ident) == 70
    assert ident == business_identity(IdentityParts("fuzz", "fuzz.topic", "due", due, marked,  # type: ignore[arg-type]
                                                    target, "run"))  # type: ignore[arg-type]
    assert MARK not in ident
    assert MARK.encode() not in route_key(marked, target)  # type: ignore[arg-type]
