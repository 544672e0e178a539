"""The ``origin`` of a transition is checked on the wire (issue 7, 4a): a malformed one is a
decode error with a fixed reason (so the worker dead-letters it), the writer refuses it, and
whatever parses can be turned into its catalog's feedback topic without an error."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamsched.errors import DecodeError
from streamsched.model.limits import MAX_NAME_LENGTH
from streamsched.model.names import validate_name
from streamsched.model.schedule import Definition
from streamsched.testing import make_event
from streamsched.wire.avro import AvroCodec
from streamsched.wire.schedule import ORIGIN_PROBLEM, occurrence_origin, origin_problem, parse_origin
from streamsched.wire.transition import decode_transition, encode_transition

SECRET = "SECRET-ORIGIN-91ab"
NAMES = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=40).filter(lambda s: s not in (".", ".."))

MALFORMED = [
    "retry",  # not an occurrence origin at all
    "sched:",
    "sched:cat:job:1",  # too few parts
    "sched:cat:job:1:2:3",  # too many
    "sched:bad catalog:job:1:2",  # names must be names
    "sched:cat:bad/name:1:2",
    "sched::job:1:2",
    "sched:cat::1:2",
    "sched:..:job:1:2",
    "sched:cat:job:x:2",  # numbers must be canonical decimal integers
    "sched:cat:job:1:+2",
    "sched:cat:job: 1:2",
    "sched:cat:job:1_0:2",
    "sched:cat:job:01:2",
    "sched:cat:job:-1:2",
    "sched:cat:job:1:99999999999999999999",  # beyond int64
    f"sched:{'c' * (MAX_NAME_LENGTH - 10)}:job:1:2",  # its feedback topic name would be too long
    f"sched:cat:job:1:2{SECRET}",
]


def _raw(origin: str | None) -> bytes:
    """Transition bytes with ``origin``, as a foreign producer (no encode-side check) writes them."""
    ev = dataclasses.replace(make_event("due", "t", ["a"]), origin=origin)
    return AvroCodec("transition").encode(ev.to_record())


@pytest.mark.parametrize("origin", MALFORMED)
def test_malformed_origin_is_refused_on_both_sides(origin: str) -> None:
    assert parse_origin(origin) is None and origin_problem(origin) == ORIGIN_PROBLEM
    with pytest.raises(DecodeError) as err:
        decode_transition(_raw(origin))
    assert err.value.reason == "origin: malformed"  # fixed: never the origin's text
    assert SECRET not in str(err.value) and SECRET not in repr(err.value.args)
    with pytest.raises(DecodeError) as enc:
        encode_transition(dataclasses.replace(make_event("due", "t", ["a"]), origin=origin))
    assert enc.value.reason == "encode: origin: malformed"


@pytest.mark.parametrize("origin", [None, "sched:default:nightly:1:1700000000000000000", "sched:c:j:0:0",
                                    "sched:c.x_y-z:J.1:9223372036854775807:-5"])
def test_absent_or_well_formed_origins_decode(origin: str | None) -> None:
    ev = decode_transition(_raw(origin))
    assert ev.origin == origin
    assert decode_transition(encode_transition(ev)) == ev


@given(catalog=NAMES, name=NAMES, version=st.integers(0, 2**63 - 1),
       planned=st.integers(-(2**63), 2**63 - 1))
def test_every_origin_the_ticker_writes_parses_back(catalog: str, name: str, version: int,
                                                    planned: int) -> None:
    defn = Definition(name=name, spec="every 1m", target_topic="jobs", payload=b"{}", version=version,
                      enabled=True, policy="coalesce", created_ns=0)
    origin = occurrence_origin(catalog, defn, planned)
    occ = parse_origin(origin)
    assert occ is not None
    assert (occ.catalog, occ.name, occ.version, occ.planned_ns) == (catalog, name, version, planned)
    validate_name(occ.feedback_topic, "topic", internal=True)
    assert decode_transition(_raw(origin)).origin == origin


@given(st.text(max_size=60) | st.text(alphabet="sched:abc019-+ ", max_size=40).map(lambda t: "sched:" + t))
def test_any_origin_text_either_parses_canonically_or_is_a_decode_error(origin: str) -> None:
    occ = parse_origin(origin)
    if occ is None:
        with pytest.raises(DecodeError, match=r"^origin: malformed$"):
            decode_transition(_raw(origin))
        return
    assert f"sched:{occ.catalog}:{occ.name}:{occ.version}:{occ.planned_ns}" == origin
    validate_name(occ.feedback_topic, "topic", internal=True)
