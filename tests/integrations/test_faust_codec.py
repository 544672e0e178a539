"""The Faust codec and routing, without a broker: the same bytes, key and partition as the Producer.

The module must import without Faust; the codec tests need faust-streaming and skip without it
(fail under ``CI=true``: tests/components.py).
"""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest
from components import needs

from streamsched.errors import BoundExceeded, ConfigError, DecodeError
from streamsched.integrations import faust as sf
from streamsched.kafka.producer import encode_event
from streamsched.model.event import TransitionEvent
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition

HAS_FAUST = importlib.util.find_spec("faust") is not None
needs_faust = needs("faust", "faust-streaming is not installed (pip install 'streamsched[faust]')",
                    found=HAS_FAUST)


def _event() -> TransitionEvent:
    return TransitionEvent(event_id="evt-1", type="due", tenant="acme", target=("inv-42",), due_ns=7,
                           payload=b'{"amount":1250}', produced_ns=time.time_ns())


def test_a_mapping_routes_exactly_as_the_producer_sends() -> None:
    ev = _event()
    doc = {"type": "due", "tenant": "acme", "target": ["inv-42"], "due_ns": 7, "event_id": "evt-1",
           "payload": {"amount": 1250}, "produced_ns": ev.produced_ns}
    key, value = encode_event(ev)
    for obj in (ev, doc):
        routed = sf.route(obj, 8)
        assert (routed.key, routed.value) == (key, value)
        assert routed.partition == partition_for_key(key, 8)


def test_to_event_defaults_and_single_string_target() -> None:
    ev = sf.to_event({"type": "due", "target": "r-1"})
    assert ev.target == ("r-1",) and ev.tenant == "" and ev.due_ns == 0 and ev.payload == b"{}"
    assert ev.attempt == 1 and ev.origin is None and ev.event_id


@pytest.mark.parametrize(("doc", "reason"), [
    ({"tenant": "a"}, "needs a 'type'"),
    ({"type": "due", "colour": "red"}, "unknown event fields ['colour']"),
    ({"type": "due", "due_ns": True}, "due_ns must be int"),
    ({"type": "due", "due_ns": "5"}, "due_ns must be int"),
    ({"type": "due", "target": [1]}, "target must be"),
    ({"type": "due", "origin": 3}, "origin must be str"),
    ({"type": "x" * 65}, "bound: type"),
    ({"type": "due", "payload": b"{not json"}, "payload"),
])
def test_invalid_events_are_refused_before_anything_is_sent(doc: dict[str, object], reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        sf.route(doc, 4)
    assert reason in str(info.value)


def test_identity_bounds_and_partition_count_are_checked() -> None:
    with pytest.raises(BoundExceeded):
        sf.route({"type": "due", "tenant": "t" * 10_000}, 4)
    for bad in (0, -1, True):
        with pytest.raises(ConfigError):
            sf.route(_event(), bad)


def test_the_module_imports_without_faust(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import faust...` raise ImportError, as when it is not installed.
    monkeypatch.setitem(sys.modules, "faust", None)
    monkeypatch.setitem(sys.modules, "faust.serializers", None)
    monkeypatch.setitem(sys.modules, "faust.serializers.codecs", None)
    sf._codec_class.cache_clear()
    try:
        with pytest.raises(sf.FaustNotInstalled):
            sf.transition_codec()
        assert sf.route(_event(), 2).partition in (0, 1)  # routing needs no Faust
    finally:
        sf._codec_class.cache_clear()


@needs_faust
def test_the_registered_codec_writes_and_reads_wire_bytes() -> None:
    from faust.serializers import codecs

    codec = sf.register_codec()
    assert sf.register_codec() is codec  # idempotent
    ev = _event()
    data = codecs.dumps(sf.CODEC_NAME, ev)
    assert data == encode_event(ev)[1]
    assert codecs.loads(sf.CODEC_NAME, data) == ev == decode_transition(data)
    assert codecs.dumps(sf.CODEC_NAME, {"type": "due", "tenant": "acme", "target": ["inv-42"], "due_ns": 7,
                                        "event_id": "evt-1", "payload": {"amount": 1250},
                                        "produced_ns": ev.produced_ns}) == data
    with pytest.raises(DecodeError):
        codecs.dumps(sf.CODEC_NAME, b"raw bytes are not an event")
    with pytest.raises(DecodeError):
        codecs.loads(sf.CODEC_NAME, b"\x00garbage")


@needs_faust
def test_a_faust_record_with_the_event_fields_is_accepted() -> None:
    import faust

    class Due(faust.Record, serializer="json"):
        type: str
        tenant: str
        target: list[str]
        due_ns: int

    routed = sf.route(Due(type="due", tenant="acme", target=["inv-42"], due_ns=7), 8)
    assert routed.key == sf.route({"type": "due", "tenant": "acme", "target": ["inv-42"], "due_ns": 7}, 8).key
